"""The short soak against real processes, broker and store."""
