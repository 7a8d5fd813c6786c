"""Unit tests of the soak plan and its checks in tests/soak/."""
