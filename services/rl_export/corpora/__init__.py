"""The corpora stage: snapshots into exactly-once JSON Lines shards in object storage.

The object store (:mod:`.store`), the layout and chains (:mod:`.layout`), the sink
(:mod:`.sink`), compaction (:mod:`.compaction`), the reader (:mod:`.reader`), ``shards``
(:mod:`.shards`) and ``replay`` (:mod:`.replay`). Imports ``common`` and ``stream``.
"""
