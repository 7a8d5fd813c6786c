"""Labeling as a team (docs/guides/labeling.md): settings, the queue's policy, claims, agreement.

Pure rules and the small store-backed pieces they need; the web service's routes and the CLI
compose them.

Sits beside ``export`` (neither imports the other): imports ``corpora``, ``stream`` and the
ground floor.
"""
