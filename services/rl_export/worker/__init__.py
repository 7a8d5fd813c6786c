"""The worker process: the join processes, the sink beside them, and their health pages.

Imports the stages below it (``common``, ``stream``, ``corpora``), never ``local`` or ``cli``.
"""
