"""``rl-export web``: the HTTP API and the RL Export page, over the corpora and Kafka.

How a request travels (the steps match :mod:`rl_export.web.app` and the routes):

1. The API's dependencies (:mod:`rl_export.web.api.deps`) check the bearer token against the
   token records in the object store (:mod:`rl_export.web.tokens`, cached for a few seconds),
   the path's org/project and the route's scope; the caller's subject is the labeler.
2. Reads (stats, the preview, the queue) are queries on this instance's query index
   (:mod:`rl_export.index.queryindex`), which follows each corpus asked about with the corpora's
   reader into DuckDB and local segment files (:mod:`rl_export.index.follower`).
3. Writes (labels, skips, retractions) are events published to Kafka with acks=all
   (:mod:`rl_export.web.publish`); 202 only after the broker acknowledged. The caller's own
   recent writes are remembered (:mod:`rl_export.web.overlay`) so their queue reflects them at
   once, before the corpora do; every instance also reads the labels topic, so the others
   follow within milliseconds.
4. Exports stream from the corpora (:mod:`rl_export.export`); background export jobs run in
   a process pool and keep their status and file in the object store
   (:mod:`rl_export.web.jobs`), so any instance answers for any job.

A process room: imports ``index``, the stages and the ground floor, never ``worker``,
``local`` or ``cli``.
"""
