"""The ``datasets.Features`` of the rows of each per-record format (docs/concepts/corpora.md,
``rl_export.hf``: a dataset "declares its features, so map, select_columns and to_parquet keep
the types").

Pure but for ``datasets``, an optional dependency (the ``hf`` extra) imported only when
features are asked for.

Public interface::

    FEATURE_FORMATS                                  # the formats that have features
    def row_features(fmt, *, corpus_row=False, tools=False) -> datasets.Features
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import datasets

FEATURE_FORMATS: tuple[str, ...] = (
    "trajectory", "messages", "prompt_completion", "kto", "rl_prompts", "executions",
)  # fmt: skip


def _datasets() -> Any:
    try:
        import datasets
    except ImportError:
        raise ImportError(
            "features need the Hugging Face datasets library: pip install 'rl-export[hf]'"
        ) from None
    return datasets


def row_features(fmt: str, *, corpus_row: bool = False, tools: bool = False) -> datasets.Features:
    """The ``datasets.Features`` of the rows of a per-record format (``corpus_row``: as a
    streaming corpus of that format holds them, ``trace_id`` and ``revision`` first).

    The rule: a value whose type is fixed has its Arrow type (``Value``, a struct, a
    ``List``); a free-form JSON object has ``datasets.Json()`` (stored as JSON text, decoded
    back to the same object): the trace's ``metadata``, ``evaluator_scores`` (one key per
    evaluator), ``evaluation.report``, ``evaluation.results`` items and ``attachments``
    items (open objects), and **every chat message** (``messages``, ``prompt``,
    ``completion``, ``conversation``: ``List(Json())``). A message is one JSON object, not a
    struct, in every chat style: a struct would give every message every field (a null
    ``tool_calls`` that Llama 3.x templates index once the key exists), drop keys it does not
    name, and cannot hold a raw content that is a string, a list of parts or null, nor hf
    ``arguments`` objects of any shape; as ``Json`` each message comes back exactly as
    rendered, so chat templates and TRL get the same dicts as without features. Chat styles
    and masks change no type. A field a stored record lacks (``metadata`` and
    ``human_labels`` before record schema 3, ``comparisons`` of a trace never compared) is
    null.
    """
    ds = _datasets()
    value, json, listed = ds.Value, ds.Json, ds.List
    string, integer, real, boolean = (value("string"), value("int64"), value("float64"),
                                      value("bool"))  # fmt: skip
    chat = listed(json())
    rubric = dict.fromkeys(("correctness", "helpfulness", "efficiency", "safety"), real)
    columns: dict[str, Any]
    if fmt == "trajectory":
        columns = {
            "trace_id": string, "org": string, "project": string, "reward_source": string,
            "revision": integer, "reward": real, "passed": boolean, "rubric": rubric,
            "labels_count": integer, "labelers": listed(string), "skipped_by": listed(string),
            "evaluator_scores": json(),
            "evaluation": {"evaluation_id": string, "occurred_at": string,
                           "results": listed(json()), "report": json()},
            "messages": chat, "agent_version": string, "scenario": string,
            "attachments": listed(json()), "completed_at": string, "updated_at": string,
            "pass_threshold": real, "rules_version": integer,
            "human_labels": listed({"labeler": string, "rubric": dict.fromkeys(rubric, integer),
                                    "comment": string, "occurred_at": string}),
            "metadata": json(),
            "comparisons": listed({"pair_id": string, "other": string, "outcome": string,
                                   "labeler": string, "strength": integer,
                                   "occurred_at": string}),
        }  # fmt: skip
    elif fmt == "messages":
        columns = {"messages": chat}
    elif fmt == "prompt_completion":
        columns = {"prompt": chat, "completion": chat, "reward": real, "passed": boolean,
                   "trace_id": string}  # fmt: skip
    elif fmt == "kto":
        columns = {"prompt": chat, "completion": chat, "label": boolean}
    elif fmt == "rl_prompts":
        columns = {
            "data_source": string, "prompt": chat, "ability": string,
            "reward_model": {"style": string, "ground_truth": json()},
            "extra_info": {"trace_id": string, "agent_version": string, "reward": real,
                           "passed": boolean, "index": integer},
        }  # fmt: skip
    elif fmt == "executions":
        columns = {
            "id": string, "conversation": chat, "report": json(), "results": listed(json()),
            "reward": real, "passed": boolean, "reward_source": string,
            "evaluator_scores": json(), "rubric": rubric, "labels_count": integer,
            "scenario": string, "agent_version": string, "org": string, "project": string,
            "revision": integer, "completed_at": string, "updated_at": string,
        }  # fmt: skip
    else:
        raise ValueError(f"unknown format {fmt!r} (formats with features: "
                         f"{', '.join(FEATURE_FORMATS)})")  # fmt: skip
    if tools and fmt in ("messages", "prompt_completion", "kto"):
        columns["tools"] = string  # rows made for a chat template: the trace's tools, as JSON
    if corpus_row and fmt != "trajectory":
        columns = {"trace_id": string, "revision": integer, **columns}
    return ds.Features(columns)
