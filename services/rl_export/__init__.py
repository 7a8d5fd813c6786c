"""rl-export: turn scored agent runs into continuously refreshed JSONL training corpora.

How an event travels (each step names the room that does it; imports only point down, from
``cli`` to the processes (``worker``, ``web``, ``local``), to ``index``, to ``export`` and
``labeling``, to ``corpora``, to ``stream``, to the ground floor: ``kafka``, ``runtime``,
``formats``, ``privacy`` and ``model``; docs/concepts/architecture.md draws the map):

1. ``stream.produce`` (or AgentHub) publishes ``trace.completed``, ``evaluation.finished``
   and ``label.*`` events, keyed by ``trace_id``, to the three input topics.
2. ``stream`` decodes each event into a pydantic model (``model.events``), merges it into
   the trace's state (``stream.join``, pure) in a table with a changelog
   (``stream.statestore``) and emits a snapshot to the ``trajectories`` topic; an event it
   cannot accept goes to the dead-letter topic with a reason.
3. ``corpora`` appends snapshots to per-corpus JSON Lines shards in object storage and
   commits them in manifest chains, exactly once (``corpora.sink``); trainers read them
   back with the reader below.
4. ``worker`` runs the join and the sink as one deployable process.

Trainers need only::

    from rl_export import CorpusReader, CorpusRef, open_store

    reader = CorpusReader(open_store("s3://bucket/rl-export"), CorpusRef("acme", "bot", "human"))
"""

from rl_export.corpora.layout import CorpusRef
from rl_export.corpora.reader import CorpusReader, Cursor, dump_cursor, load_cursor
from rl_export.corpora.store import ObjectStore, open_store

__version__ = "0.1.0"

__all__ = [
    "CorpusReader",
    "CorpusRef",
    "Cursor",
    "ObjectStore",
    "dump_cursor",
    "load_cursor",
    "open_store",
]
