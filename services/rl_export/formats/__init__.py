"""The shapes rows take: training formats, chat styles, turns, filters and corpus specs (pure).

The training formats rendered from a record (:mod:`.render`), chat styles (:mod:`.chat`),
turns and per-turn masks (:mod:`.turns`), the filters (:mod:`.filters`), corpus specs
(:mod:`.specs`) and the JSON Schema files generated from the models (:mod:`.schemas`).

Imports ``model`` and ``privacy``.
"""
