"""The stream stage: the join of the three input topics into trajectory snapshots.

Pure join rules (:mod:`.join`), the batch processor (:mod:`.processor`), the Kafka loop
(:mod:`.loop`) and its emitter (:mod:`.emitter`), the state table (:mod:`.statestore`),
topics (:mod:`.topics`) and ``produce`` (:mod:`.produce`).

Imports only the ground floor (``model``, ``privacy``, ``formats``, ``runtime``, ``kafka``).
"""
