"""The fault soak (``make soak``; its short run is an integration test): run from the checkout
with ``python -m tests.soak.soak``, never shipped in the wheel."""
