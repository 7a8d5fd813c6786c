"""rl-export: turn scored agent runs into continuously refreshed JSONL training corpora.

How an event travels (each step names the module that does it):

1. ``produce`` (or AgentHub) publishes ``trace.completed``, ``evaluation.finished`` and
   ``label.*`` events, keyed by ``trace_id``, to the three input topics (:mod:`topics`).
2. The worker decodes each event from its JSON bytes into a pydantic model (:mod:`events`);
   an event that cannot be accepted goes to the dead-letter topic with a reason.
3. The join (:mod:`join`, run by :mod:`worker`) merges the event into the trace's state in
   a table with a changelog (:mod:`statestore`) and, once the trace exists, emits a
   snapshot to the ``trajectories`` topic (:mod:`records`).
4. The sink appends snapshots to per-corpus JSONL shards in object storage (:mod:`store`)
   and commits them in manifest chains; trainers read them back.

Configuration lives in one frozen settings class (:mod:`settings`).
"""

__version__ = "0.1.0"
