"""The API's routes, one module per tab: ``export`` (stats, records, exports) and ``label``
(queue, labels, skips, retractions)."""
