"""Tests that build an artifact from the checkout (the wheel, the docs site), offline."""
