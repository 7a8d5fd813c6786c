"""The worker process: the join processes, the sink beside them, and their health pages.

Imports the stages below it (``corpora``, ``stream``) and the ground floor, never ``web``,
``local`` or ``cli``.
"""
