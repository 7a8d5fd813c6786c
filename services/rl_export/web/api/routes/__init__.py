"""The API's routes, a module per tab or noun: ``export`` (stats, records, direct exports),
``jobs`` (background exports), ``label`` (queue, claims, labels, skips, retractions, labeling
settings), ``agreement``, ``versions`` and ``caller`` (who the token is)."""
