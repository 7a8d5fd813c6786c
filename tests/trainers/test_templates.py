"""Rows made for chat templates TRL does not ship (issue 55), with the trainers that use them.

The corpus of the conftest plus agent conversations with tools in their metadata (tool calls
with and without text beside them, parallel calls, ids as OpenAI and Anthropic write them, no
ids at all), exported by the CLI with ``--chat-template`` in every chat format for 14
templates (the seven built-in ones, vLLM's, and seven of tests/data/chat_templates/, with their
sources in its SOURCES.md). Then:

- every row written renders through the tokenizer's ``apply_chat_template`` (the rows loaded
  with ``load_dataset`` as a user loads them, the row's ``tools`` passed as TRL passes them)
  with every message's text; the rows left out are counted by reason, the same in the
  summary and the manifest, and with the rows written they are all the format's rows;
- TRL's SFT with ``assistant_only_loss`` (the template marked by ``rl-export template
  mark``), DPO and KTO train with two of them, and SFT's masks are the assistant messages,
  exactly, on every row (the prefix rule of ``tokenize_for_sft``, token for token);
- verl's ``MultiTurnSFTDataset`` reads the ``messages`` Parquet made for a template, and one
  SFT step runs on it with verl's own collator and loss.
"""

from __future__ import annotations

import contextlib
import copy
import io
import json
import re
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from rl_export.cli import main
from rl_export.formats.fit import DROPS_CALLS, missing
from rl_export.formats.templates import BUILTIN_DIR
from rl_export.hf import tokenize_row
from rl_export.model.codec import dumps
from tests.chattemplates import CONVERSATIONS, TEST_DIR, TOOLS
from tests.records import trace_events
from tests.trainers.conftest import ORG, PROJECT, corpus_events, rl_export
from tests.trainers.test_trl import common, load, train

BUILTIN = ("chatml", "deepseek_v3_tools", "granite_3_tools", "llama3_1_json_tools",
           "mistral_v03_tools", "olmo3_tools", "phi4_mini_tools")  # fmt: skip
FROM_TESTS = ("qwq_32b", "qwen3_coder", "gemma3_pythonic_tools", "mistral_nemo_2407",
              "hermes_3_tool_use", "functionary_v3_1", "granite_3_3")  # fmt: skip
TEMPLATES = BUILTIN + FROM_TESTS
FORMATS = ("messages", "prompt_completion", "preference", "kto")
TRAINED = ("qwq_32b", "gemma3_pythonic_tools")  # SFT (assistant-only loss), DPO and KTO
# The exports of the fixture below (about 60) take minutes on a busy machine.
pytestmark = pytest.mark.timeout(1800)


def given(name: str) -> str:
    """How a user names it: a built-in by name, another by its file."""
    return name if name in BUILTIN else str(TEST_DIR / f"{name}.jinja")


def text_of(name: str) -> str:
    folder = BUILTIN_DIR if name in BUILTIN else TEST_DIR
    return (folder / f"{name}.jinja").read_text()


def agent_events() -> list[dict[str, Any]]:
    """Each agent conversation twice (the same prompt, another last reply, a lower score),
    with and without tools in the trace's metadata."""
    out: list[dict[str, Any]] = []
    n = 100
    for tools in (False, True):
        for messages in CONVERSATIONS.values():
            for k, score in enumerate((0.85, 0.15)):
                shaped = copy.deepcopy(messages)
                if k:
                    shaped[-1] = {"role": "assistant", "content": f"Another reply {n}."}
                out += trace_events(n, score=score, passed=score > 0.5, minute=n % 60,
                                    messages=shaped, scenario="agent",
                                    metadata={"tools": TOOLS} if tools else None)  # fmt: skip
                n += 1
    return out


@dataclass(frozen=True)
class Made:
    """One export made for a template: its file, the summary line, the manifest."""

    path: Path
    note: str
    manifest: dict[str, Any]

    def rows(self) -> list[dict[str, Any]]:
        return [json.loads(line) for line in self.path.read_text().splitlines()]


@pytest.fixture(scope="session")
def agent_store(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("agents")
    events = root / "events.jsonl"
    events.write_bytes(b"".join(dumps(e) + b"\n" for e in corpus_events() + agent_events()))
    rl_export("replay", str(events), "--store", str(root / "store"))
    return root / "store"


def export(store: Path, out: Path, fmt: str, *flags: str) -> str:
    """``rl-export export`` in this process (the command line's own code, without starting
    an interpreter for each of the fixture's exports); its stderr, exit 0 required."""
    out.parent.mkdir(parents=True, exist_ok=True)
    argv = ["export", "--store", str(store), "--org", ORG, "--project", PROJECT, "--source",
            "evaluator", "--format", fmt, *flags, "-o", str(out)]  # fmt: skip
    said = io.StringIO()
    with contextlib.redirect_stderr(said):
        code = main(argv)
    assert code == 0, said.getvalue()
    return said.getvalue()


@pytest.fixture(scope="session")
def made(agent_store: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[Any, Made]:
    """Every (template, format) export, with ``--card`` (its manifest), and each format's
    export without a template (``(None, format)``)."""
    root = tmp_path_factory.mktemp("made")
    out: dict[Any, Made] = {}
    for fmt in FORMATS:
        path = root / "plain" / fmt / f"{fmt}.jsonl"
        export(agent_store, path, fmt)
        out[None, fmt] = Made(path, "", {})
        for name in TEMPLATES:
            path = root / name / fmt / f"{fmt}.jsonl"
            note = export(agent_store, path, fmt, "--chat-template", given(name), "--card")
            manifest = json.loads(path.with_name(path.name + ".manifest.json").read_text())
            out[name, fmt] = Made(path, note, manifest)
    return out


def conversations(fmt: str, row: dict[str, Any]) -> list[list[dict[str, Any]]]:
    if fmt == "messages":
        return [row["messages"]]
    if fmt == "preference":
        return [row["prompt"] + row["chosen"], row["prompt"] + row["rejected"]]
    return [row["prompt"] + row["completion"]]


def with_template(tokenizer: Any, text: str) -> Any:
    """The tiny tokenizer with a template (and a BOS token, which Qwen's tokenizers lack and
    Llama-family templates print)."""
    tok = copy.deepcopy(tokenizer)
    tok.chat_template = text
    if "bos_token" in text and tok.bos_token is None:
        tok.bos_token = "<|endoftext|>"
    return tok


@pytest.mark.parametrize("name", TEMPLATES)
def test_every_row_written_renders_with_every_text(
    name: str, made: dict[Any, Made], tokenizer: Any
) -> None:
    tok = with_template(tokenizer, text_of(name))
    kept_calls = 0
    for fmt in FORMATS:
        export_ = made[name, fmt]
        dataset = load(export_.path) if export_.path.stat().st_size else []
        for row in dataset:
            tools = json.loads(row["tools"]) if row.get("tools") else None
            for conversation in conversations(fmt, row):
                text = tok.apply_chat_template(conversation, tools=tools, tokenize=False)
                assert missing(conversation, text) is None, (name, fmt)
                kept_calls += any(m.get("tool_calls") for m in conversation)
        left = export_.manifest["unrenderable"]
        assert export_.manifest["rows"] == len(dataset)
        # The summary on stderr says the same as the manifest.
        said = re.search(r"(\d+) rows left out: (.*?)(?:; dataset card|$)", export_.note)
        if left:
            assert said is not None, export_.note
            assert int(said.group(1)) == sum(left.values())
            for reason, n in left.items():
                assert f"{reason} ({n})" in said.group(2)
        else:
            assert "no row left out" in export_.note
        if fmt != "preference":  # (pairs form among traces with the same tools)
            plain = len(made[None, fmt].path.read_text().splitlines())
            assert len(dataset) + sum(left.values()) == plain
    if name not in ("chatml", "granite_3_3", "zephyr"):
        assert kept_calls, f"{name}: no row with a tool call kept"


def test_a_template_that_drops_tool_calls_silently_is_caught(made: dict[Any, Made]) -> None:
    """Granite 3.3's official template renders a conversation with tool calls without an
    error and without the calls: every such row is left out, as dropping them."""
    rows = made["granite_3_3", "messages"].rows()
    assert rows
    assert not any(m.get("tool_calls") for r in rows for m in r["messages"])
    plain = made[None, "messages"].rows()
    called = sum(any(m.get("tool_calls") for m in r["messages"]) for r in plain)
    assert made["granite_3_3", "messages"].manifest["unrenderable"] == {DROPS_CALLS: called}


@pytest.fixture(scope="module")
def marked(made: dict[Any, Made], tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    """``rl-export template mark`` of the trained templates, checked on the export's rows."""
    root = tmp_path_factory.mktemp("marked")
    out = {}
    for name in TRAINED:
        path = root / f"{name}.jinja"
        rows = [made[name, fmt].path for fmt in FORMATS]
        rl_export("template", "mark", given(name), "-o", str(path),
                  *[a for r in rows for a in ("--rows", str(r))])  # fmt: skip
        out[name] = path.read_text()
    return out


@pytest.mark.parametrize("name", TRAINED)
def test_sft_with_assistant_only_loss_learns_exactly_the_assistant_messages(
    *, name: str, made: dict[Any, Made], marked: dict[str, str], tokenizer: Any, model: str,
    tmp_path: Path,
) -> None:  # fmt: skip
    from trl import SFTConfig, SFTTrainer

    tok = with_template(tokenizer, marked[name])
    dataset = load(made[name, "messages"].path)
    trainer = SFTTrainer(
        model=model, args=SFTConfig(**common(tmp_path), max_length=4096,
                                    assistant_only_loss=True),
        train_dataset=dataset, processing_class=tok,
    )  # fmt: skip
    prepared = list(trainer.train_dataset)
    assert len(prepared) == len(dataset) > 0
    original = text_of(name)
    for source, example in zip(dataset, prepared, strict=True):
        # TRL's labels (the marked template's blocks: -100 where they are not) are the
        # prefix rule's mask, token for token.
        ours = tokenize_row(source, tok, chat_template=original, mask_failed_turns=False)
        assert example["input_ids"] == ours["input_ids"]
        pairs = zip(ours["input_ids"], ours["assistant_masks"], strict=True)
        assert example["labels"] == [t if m else -100 for t, m in pairs]
        learned = tok.decode([t for t in example["labels"] if t != -100])
        said = [m["content"].strip() for m in source["messages"] if m["role"] == "assistant"]
        rest = learned
        for content in filter(None, said):
            assert content in learned
            rest = rest.replace(content, "")
        for message in source["messages"]:  # nothing else is learned
            if message["role"] != "assistant" and message["content"].strip():
                assert message["content"].strip() not in rest, message["role"]
    train(trainer)


@pytest.mark.parametrize("name", TRAINED)
def test_dpo_and_kto_train_on_rows_made_for_the_template(
    name: str, made: dict[Any, Made], tokenizer: Any, model: str, tmp_path: Path
) -> None:
    from trl import DPOConfig, DPOTrainer, KTOConfig, KTOTrainer

    tok = with_template(tokenizer, text_of(name))
    pairs = load(made[name, "preference"].path)
    assert len(pairs) >= 2
    train(DPOTrainer(model=model, args=DPOConfig(**common(tmp_path / "dpo"), max_length=2048),
                     train_dataset=pairs, processing_class=tok))  # fmt: skip
    unpaired = load(made[name, "kto"].path)
    assert set(unpaired["label"]) == {True, False}
    train(KTOTrainer(model=model, args=KTOConfig(**common(tmp_path / "kto"), max_length=2048),
                     train_dataset=unpaired, processing_class=tok))  # fmt: skip


def test_verl_reads_the_parquet_made_for_a_template_and_takes_a_step(
    agent_store: Path, tokenizer: Any, model: str, tmp_path: Path
) -> None:
    """verl 0.9.1: ``MultiTurnSFTDataset`` on the ``messages`` Parquet (``data.messages_key=
    messages``, ``data.tools_key=tools``), which renders each message alone and checks that
    the pieces make the whole (the export checked it too); then one SFT step with verl's own
    collator and loss (its FSDP engine needs a GPU platform: verl 0.9.1 has no CPU one)."""
    import pyarrow.parquet as pq
    import torch
    from omegaconf import OmegaConf
    from torch.utils.data import DataLoader
    from transformers import AutoModelForCausalLM
    from verl.utils import tensordict_utils as tu
    from verl.utils.dataset.dataset_utils import DatasetPadMode, SFTTensorCollator
    from verl.utils.dataset.multiturn_sft_dataset import MultiTurnSFTDataset
    from verl.workers.utils.losses import sft_loss

    path = tmp_path / "sft.parquet"
    note = export(agent_store, path, "messages", "--chat-template", "chatml", "--card")
    table = pq.read_table(path).to_pylist()
    assert table, note
    tok = with_template(tokenizer, text_of("chatml"))
    config = OmegaConf.create({"pad_mode": "right", "max_length": 2048, "truncation": "error",
                               "messages_key": "messages", "tools_key": "tools"})  # fmt: skip
    dataset = MultiTurnSFTDataset(str(path), tok, config)
    assert len(dataset) == len(table)
    for n, row in enumerate(table):
        item = dataset[n]  # verl's own check of the pieces against the whole runs here
        learned = tok.decode(item["input_ids"][item["loss_mask"].bool()].tolist())
        for message in row["messages"]:
            if message["role"] == "assistant" and message["content"]:
                assert message["content"].strip() in learned
    batch = next(iter(DataLoader(dataset, batch_size=2,
                                 collate_fn=SFTTensorCollator(DatasetPadMode.RIGHT))))  # fmt: skip
    lm = AutoModelForCausalLM.from_pretrained(model)
    before = {k: v.detach().clone() for k, v in lm.state_dict().items()}
    optimizer = torch.optim.AdamW(lm.parameters(), lr=1e-2)
    logits = lm(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"],
                position_ids=batch["position_ids"]).logits  # fmt: skip
    log_probs = torch.log_softmax(logits[:, :-1].float(), -1).gather(
        -1, batch["input_ids"][:, 1:].unsqueeze(-1)).squeeze(-1)  # fmt: skip
    mask = batch["loss_mask"][:, 1:]  # the token each log-prob predicts
    counts = {"pad_mode": DatasetPadMode.RIGHT, "dp_size": 1, "batch_num_tokens": int(mask.sum())}
    data = tu.get_tensordict({"response_mask": mask}, counts)
    loss, _ = sft_loss(None, {"log_probs": log_probs}, data)
    assert torch.isfinite(loss)
    loss.backward()
    optimizer.step()
    assert any(not lm.state_dict()[k].equal(v) for k, v in before.items())


def test_the_cli_refuses_what_cannot_work(agent_store: Path, tmp_path: Path) -> None:
    """One line and exit 2: a chat style the template decides, a template that does not
    compile, --on-unrenderable fail on a row it cannot render, marking a template whose
    prefixes change."""
    bad = tmp_path / "bad.jinja"
    bad.write_text("{% for m in messages %}")
    for flags, expected in (
        (["--chat-template", "chatml", "--chat-style", "openai"], "--chat-style openai"),
        (["--chat-template", str(bad)], "bad is not a chat template"),
        (["--chat-template", given("granite_3_3"), "--on-unrenderable", "fail"],
         "drops tool calls"),
    ):  # fmt: skip
        result = subprocess.run(
            [sys.executable, "-m", "rl_export.cli", "export", "--store", str(agent_store),
             "--org", ORG, "--project", PROJECT, "--source", "evaluator", "--format",
             "messages", *flags, "-o", str(tmp_path / "x.jsonl")],
            capture_output=True, text=True, check=False,
        )  # fmt: skip
        assert result.returncode == 2, result.stderr
        assert expected in result.stderr
        assert len(result.stderr.strip().splitlines()) == 1
        assert not (tmp_path / "x.jsonl").exists()
    result = subprocess.run(
        [sys.executable, "-m", "rl_export.cli", "template", "mark", "phi4_mini_tools", "-o",
         str(tmp_path / "m.jinja")], capture_output=True, text=True, check=False,
    )  # fmt: skip
    assert result.returncode == 2
    assert "cannot place {% generation %} markers in phi4_mini_tools safely" in result.stderr
    assert not (tmp_path / "m.jinja").exists()
