"""The shared ground every stage may import: settings, errors, the event and record models,
JSON encoding, partitioning, corpus specs and metrics. Imports nothing above it."""
