"""The HTTP API's request and response bodies (docs/concepts/web-service.md), as pydantic models.

The OpenAPI document at ``/api/v1/openapi.json`` is generated from these and the routes'
signatures. Request bodies forbid unknown fields: a ``labeler`` in a label is a 422, since the
labeler is always the token's subject.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal, get_args

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field

from rl_export.export import SOURCES
from rl_export.formats.chat import ChatStyle, SystemMode
from rl_export.formats.filters import filter_text
from rl_export.formats.render import JSONL_FORMATS, PAIR_FORMATS, TABULAR_FORMATS, Completion
from rl_export.labeling.agreement import AgreementReport
from rl_export.labeling.questions import ByQuestion
from rl_export.labeling.settings import Order, PairOn, PairVersions, ShowEvaluations
from rl_export.model.events import Answer, LabelKind
from rl_export.model.rubrics import MAX_TEXT, Question

Source = Literal["human", "evaluator", "traces", "comparisons"]
Format = Literal[
    "trajectory", "prompt_completion", "messages", "kto", "preference", "executions",
    "rl_prompts", "reward_pairs", "csv", "json", "parquet", "zip",
]  # fmt: skip
File = Literal["jsonl", "parquet"]
# The API's enums are the export package's lists (the OpenAPI document needs literals).
assert set(get_args(Format)) == set(JSONL_FORMATS + PAIR_FORMATS + TABULAR_FORMATS)
assert set(get_args(Source)) == set(SOURCES)

TRACE_ID_PATTERN = r"^[^\x00-\x1f\x7f]+$"
TraceId = Field(min_length=1, max_length=512, pattern=TRACE_ID_PATTERN)


class _In(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class ErrorOut(BaseModel):
    """Every error: a short code and a sentence for people."""

    error: str = Field(examples=["invalid"])
    detail: str = Field(examples=["min-reward: 'abc' is not a number"])


class HistogramBin(BaseModel):
    lo: float
    hi: float
    count: int


class IndexState(BaseModel):
    """How current the answer is: this instance's index of the corpus."""

    ready: bool = Field(description="The index has read the corpus at least once.")
    lag_s: float = Field(description="Commits made within this many seconds may be missing.")
    indexed: int = Field(description="Live records the index holds for the corpus.")
    error: str | None = Field(None, description="The last problem reading the corpus, if any.")


class StatsOut(BaseModel):
    records: int
    avg_reward: float | None
    pass_rate: float | None
    human_labeled: int
    reward_histogram: list[HistogramBin]
    index: IndexState


class RecordsOut(BaseModel):
    items: list[dict[str, Any]]
    columns: list[str] | None = Field(
        None, description="The headers of a tabular format's rows, in order."
    )
    note: str | None = Field(
        None, description="When the preview has no row: why (preference: no shared prompt)."
    )
    index: IndexState


CHAT_STYLE_HELP = (
    "messages, prompt_completion, preference, kto: hf (default; string content, tool-call "
    "arguments as objects), openai (arguments as JSON strings) or raw (as received)"
)
SYSTEM_HELP = "With a chat format: keep (default) or merge (system into the first user message)"
CHAT_TEMPLATE_HELP = (
    "messages, prompt_completion, preference, kto: make every row for this chat template, "
    "named (the service's RL_EXPORT_CHAT_TEMPLATES folder, or a built-in), and write only "
    "rows that render with every message's text (docs/guides/trainers.md)"
)
ON_UNRENDERABLE_HELP = (
    "With chat_template: skip (default; rows the template cannot render left out, counted "
    "by reason in X-RL-Export-Skipped or the job's status) or fail (422 at the first)"
)
COMPLETION_HELP = (
    "preference: turn (default; the agent's reply to the prompt, up to the next user message) "
    "or rest (everything after the prompt)"
)


class QueueOut(BaseModel):
    remaining: int = Field(description="Traces left in the caller's queue, these included.")
    team_remaining: int = Field(
        description="Traces whose current labels are still short of their target."
    )
    labeled: int = Field(description="Traces the caller has a current label on.")
    items: list[dict[str, Any]] = Field(description="Trajectory records of the traces corpus.")
    index: IndexState


class ClaimIn(_In):
    limit: int = Field(1, ge=1, le=10, description="How many traces to hold at once.")
    scenario: str | None = None
    agent_version: str | None = None
    passed: bool | None = Field(None, description="Only traces the evaluators passed (or not).")


class ClaimItem(BaseModel):
    trace_id: str
    expires_at: str = Field(description="When the claim ends unless labeled, skipped or renewed.")


class ClaimOut(BaseModel):
    lease_expires_at: str | None = Field(
        description="When the earliest of the returned claims ends (null: none returned)."
    )
    claims: list[ClaimItem]
    remaining: int
    team_remaining: int
    labeled: int
    items: list[dict[str, Any]] = Field(description="The claimed traces' records, in order.")
    index: IndexState


class AgreementOut(AgreementReport):
    """The agreement report (docs/guides/labeling.md), when it was computed, and how current
    the index is."""

    adjudicated: int = Field(0, description="Traces a reviewer decided (the alphas are of the "
                             "labels: agreement before review).")  # fmt: skip
    by_question: ByQuestion | None = Field(
        None,
        description="Agreement per question within one rubric version (its kinds' "
        "levels: ordinal ratings, nominal choices and booleans, none for text).",
    )
    computed_at: str = Field(description="When the report's input was read (UTC).")
    updating: bool = Field(
        description="Labels changed the corpus since: a newer report is being computed "
        "(at most RL_EXPORT_WEB_AGREEMENT_MAX_AGE_S after this one was)."
    )
    index: IndexState


class LabelingOut(BaseModel):
    """A project's labeling settings (docs/guides/labeling.md)."""

    labels_per_trace: int
    lease_s: int
    order: Order
    adjudicate_spread: float | None
    blind: bool = Field(
        description="Queue and claim items hide other labelers' ratings, comments and names."
    )
    show_evaluations: ShowEvaluations = Field(
        description="When labelers see the evaluators' verdict: after_label, always or never."
    )
    pair_on: PairOn = Field(description="Comparisons: pairs share the prompt or the scenario.")
    pair_versions: PairVersions = Field(
        description="Comparisons: a pair's agent versions differ (different) or not (any)."
    )
    comparisons_per_pair: int = Field(description="Comparisons: the target per pair.")
    editable: bool = Field(False, description="Whether the caller may change them (admin).")


class LabelingIn(_In):
    """A change of the labeling settings: the fields given replace the current ones."""

    labels_per_trace: int | None = Field(None, description="1..10")
    lease_s: int | None = Field(None, description="30..86400")
    order: str | None = Field(None, description="oldest, newest, uncertain or random")
    adjudicate_spread: float | None = Field(None, description="null, or 0..0.8")
    blind: bool | None = Field(
        None, description="true (the default): labelers never see each other's labels"
    )
    show_evaluations: str | None = Field(
        None, description="after_label (the default), always or never"
    )
    pair_on: str | None = Field(None, description="prompt (the default) or scenario")
    pair_versions: str | None = Field(None, description="different (the default) or any")
    comparisons_per_pair: int | None = Field(None, description="1..10")


class LabelIn(_In):
    trace_id: str = TraceId
    rubric: dict[str, Answer] = Field(
        description="The answers by question name: of version 0 (absent rubric_version), the "
        "four ratings correctness, helpfulness, efficiency and safety, each 1..5."
    )
    rubric_version: int = Field(0, ge=0, le=1_000_000, description="GET rubric's version.")
    kind: LabelKind = Field(
        "label", description="adjudication: a reviewer's decision (review scope)."
    )
    comment: str | None = Field(None, max_length=MAX_TEXT)


class RubricOut(BaseModel):
    """A version of the project's rubric (docs/guides/rubrics.md)."""

    version: int = Field(description="0: the default four 1..5 ratings.")
    guidelines: str = Field(description="Markdown, as the admin wrote it.")
    guidelines_html: str = Field(
        description="The guidelines rendered (no raw HTML, http(s) links)."
    )
    questions: list[Question]
    created_by: str | None = None
    created_at: str | None = None
    latest: int = Field(description="The project's newest version.")
    editable: bool = Field(False, description="Whether the caller may change it (admin).")
    created: bool | None = Field(
        None, description="PUT only: a new version was made (false: equal to the newest)."
    )


class MyLabelOut(BaseModel):
    trace_id: str
    scenario: str
    agent_version: str
    occurred_at: str | None
    kind: LabelKind
    rubric_version: int
    reward: float | None
    comment: str | None


class MyLabelsOut(BaseModel):
    items: list[MyLabelOut]
    next_cursor: str | None = Field(description="Ask again with cursor= for the next page.")
    index: IndexState


class TraceOut(BaseModel):
    """One trace as a labeler sees it (``GET traces/{trace_id}``)."""

    item: dict[str, Any] = Field(description="The record: blind, redacted, evaluations hidden "
                                 "unless the project's show_evaluations allows them.")  # fmt: skip
    my_label: dict[str, Any] | None = Field(
        description="The caller's current label as the corpora show it (its human_labels entry)."
    )
    labeled: bool = Field(description="The caller has a current label on the trace.")
    evaluations_shown: bool
    index: IndexState


class ReviewOut(BaseModel):
    """The review queue: traces whose labels disagree (docs/guides/rubrics.md)."""

    items: list[dict[str, Any]] = Field(description="Records, every label with its labeler.")
    remaining: int
    claims: list[ClaimItem] = Field(default_factory=list)
    lease_expires_at: str | None = None
    index: IndexState


class SkipIn(_In):
    trace_id: str = TraceId


class WhoamiOut(BaseModel):
    """Who a token is (``GET whoami``)."""

    subject: str = Field(description="The user: the labeler of the labels this token gives.")
    org: str
    project: str
    scopes: list[str] = Field(description="label, export, admin (both and settings), raw, review.")


class AcceptedOut(BaseModel):
    event_id: str = Field(description="The published event's id (a UUID).")


def _filters_text(value: Any) -> Any:
    """Filters given as JSON values (``{"passed": true}``) as the query string spells them."""
    if not isinstance(value, dict):
        return value
    return {
        name: [filter_text(name, v) for v in item] if isinstance(item, list)
        else filter_text(name, item)
        for name, item in value.items()
    }  # fmt: skip


FilterValues = Annotated[dict[str, str | list[str]], BeforeValidator(_filters_text)]


class VersionIn(_In):
    corpus: str = Field(min_length=1, max_length=128, description="The corpus to pin")
    name: str = Field(min_length=1, max_length=128, description="The version's name")
    note: str = Field("", max_length=2000, description="What the version is for")


class VersionOut(BaseModel):
    name: str
    org: str
    project: str
    corpus: str
    note: str
    created_at: str
    generation: int | None
    ends: dict[str, int]
    delta_version: int | None = Field(
        None, description="The Delta version of the corpus's open table at this position"
    )


class VersionsOut(BaseModel):
    items: list[VersionOut]


class ExportIn(_In):
    source: Source
    format: Format
    filters: FilterValues = Field(
        default_factory=dict,
        description="Filters by their query parameter names, as JSON values or their text: "
        '{"passed": true, "min_reward": 0.5, "pass_dimension": ["goal"]}.',
    )
    columns: str | list[str] | None = Field(
        None, description="Tabular formats: PATH[:HEADER] items, in order."
    )
    mask_failed_turns: bool = Field(
        False,
        description="messages, prompt_completion: a weight on every assistant message, 0 in "
        "turns with a failing outcome (docs/guides/exports.md).",
    )
    mask_types: str | list[str] | None = Field(
        None, description="With mask_failed_turns: only outcomes of these types mask."
    )
    file: File = Field(
        "jsonl", description="rl_prompts, messages: jsonl or parquet (verl's files)."
    )
    redact: str | list[str] | None = Field(
        None,
        description="Kinds to replace with [REDACTED:KIND] (secrets, email, phone, credit_card, "
        "iban, ip, pii, all, none); default: the service's RL_EXPORT_REDACT (secrets).",
    )
    chat_style: ChatStyle | None = Field(None, description=CHAT_STYLE_HELP)
    system: SystemMode | None = Field(None, description=SYSTEM_HELP)
    chat_template: str | None = Field(None, description=CHAT_TEMPLATE_HELP)
    on_unrenderable: Literal["skip", "fail"] | None = Field(None, description=ON_UNRENDERABLE_HELP)
    completion: Completion | None = Field(None, description=COMPLETION_HELP)
    split: str | None = Field(None, description="Keep the rows of this split (with splits).")
    splits: str | None = Field(
        None, description="NAME=FRACTION,... summing to 1, e.g. train=0.9,eval=0.05,test=0.05."
    )
    split_by: str | None = Field(
        None, description="What decides a row's split: trace_id (default), a field, metadata.KEY."
    )
    split_salt: str | None = Field(None, description="A salt for the split's hash.")
    dedup: Literal["exact", "near"] | None = Field(
        None, description="Keep one row per group of duplicates (the best reward)."
    )
    dedup_threshold: float | None = Field(
        None, description="near: least estimated Jaccard similarity, in (0, 1] (default 0.85)."
    )
    dedup_on: Literal["conversation", "prompt"] | None = Field(
        None, description="The text compared: every message, or up to the first user message."
    )
    version: str | None = Field(
        None,
        description="Read the corpus at this pinned version (GET versions): the job's "
        "file is what an export made when it was pinned gave, less the traces deleted since.",
    )


class JobOut(BaseModel):
    id: str
    subject: str | None = Field(
        None, description="Who made the job (null: a job made before jobs had owners)."
    )
    raw: bool = Field(
        False,
        description="It reads with a redaction weaker than the project's default: only its "
        "subject sees it, and its download needs the raw scope.",
    )
    created_at: str | None = None
    status: Literal["processing", "ready", "failed"]
    progress: float = Field(ge=0, le=1)
    records: int | None = None
    error: str | None = None
    file_name: str | None = None
    download: str | None = Field(None, description="Where the finished file is (ready only).")
    turns_outside: int | None = Field(
        None,
        description="With turn masks, once ready: failing outcomes whose turn is outside "
        "their conversation (they mask nothing).",
    )
    redactions: dict[str, int] | None = Field(
        None, description="Substrings replaced per kind (ready only)."
    )
    note: str | None = Field(
        None, description="Once ready: why the export has no row, and what to try."
    )
    duplicates_removed: int | None = Field(
        None, description="With dedup, once ready: rows removed as duplicates."
    )
    split_left_out: int | None = Field(
        None, description="With a split, once ready: matching rows of the other splits."
    )
    unrenderable: dict[str, int] | None = Field(
        None,
        description="With a chat template, once ready: the rows it left out, by reason "
        "(raises: <message>, drops text, drops tool calls, garbles arguments).",
    )
    adaptations: list[str] | None = Field(
        None, description="With a chat template, once ready: what every row got for it."
    )


class JobsOut(BaseModel):
    items: list[JobOut] = Field(description="The jobs the caller may see, newest first.")
