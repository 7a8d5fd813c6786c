"""The corpora stage: snapshots into exactly-once JSON Lines shards in object storage.

The object store (:mod:`.store`), the layout (:mod:`.layout`), commits and chains
(:mod:`.commits`), what compactions wrote (:mod:`.compacted`), the sink (:mod:`.sink`),
compaction (:mod:`.compaction`), the reader (:mod:`.reader`), ``shards`` (:mod:`.shards`)
and ``replay`` (:mod:`.replay`).

Imports ``stream`` and the ground floor (``model``, ``privacy``, ``formats``, ``runtime``,
``kafka``).
"""
