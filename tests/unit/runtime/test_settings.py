from __future__ import annotations

import os
from pathlib import Path

import pytest
from pydantic import ValidationError

from rl_export.formats.filters import Filters
from rl_export.model.errors import ConfigError
from rl_export.privacy.kinds import PII_KINDS
from rl_export.privacy.redact import KINDS
from rl_export.runtime.settings import Settings, load_settings
from rl_export.runtime.storeurl import parse_store_url


def test_defaults_follow_the_design() -> None:
    s = Settings()
    assert s.input_topics == ("traces.completed", "evaluations.finished", "labels.submitted")
    assert s.partitions == 8
    assert s.human_pass_threshold == 0.7
    assert s.max_event_bytes == 1024 * 1024
    assert s.shard_max_age_s == 10.0
    assert s.orphan_retention_s == 7 * 24 * 3600


def test_environment_uses_the_rl_export_prefix(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RL_EXPORT_PARTITIONS", "3")
    monkeypatch.setenv("RL_EXPORT_SHARD_MAX_RECORDS", "50")
    monkeypatch.setenv("RL_EXPORT_KAFKA_BOOTSTRAP", "a:1, b:2")
    s = load_settings()
    assert (s.partitions, s.shard_max_records, s.kafka_bootstrap) == (3, 50, "a:1,b:2")


def test_overrides_beat_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RL_EXPORT_KAFKA_BOOTSTRAP", "env:1")
    assert load_settings(kafka_bootstrap="flag:2").kafka_bootstrap == "flag:2"
    assert load_settings(kafka_bootstrap=None).kafka_bootstrap == "env:1"


def test_settings_are_frozen() -> None:
    with pytest.raises(ValidationError):
        Settings().partitions = 2  # type: ignore[misc]


@pytest.mark.parametrize(
    ("env", "value", "named", "says"),
    [
        ("RL_EXPORT_STORE_URL", "http://example.com/x", "RL_EXPORT_STORE_URL", "scheme"),
        ("RL_EXPORT_STORE_URL", "s3://", "RL_EXPORT_STORE_URL", "bucket"),
        ("RL_EXPORT_STORE_URL", "file://relative/path", "RL_EXPORT_STORE_URL", "file:///"),
        ("RL_EXPORT_KAFKA_BOOTSTRAP", "localhost", "RL_EXPORT_KAFKA_BOOTSTRAP", "host:port"),
        ("RL_EXPORT_PARTITIONS", "zero", "RL_EXPORT_PARTITIONS", "integer"),
        ("RL_EXPORT_HUMAN_PASS_THRESHOLD", "1.5", "RL_EXPORT_HUMAN_PASS_THRESHOLD", "1"),
    ],
)
def test_bad_settings_name_the_variable(
    monkeypatch: pytest.MonkeyPatch, env: str, value: str, named: str, says: str
) -> None:
    monkeypatch.setenv(env, value)
    with pytest.raises(ConfigError) as info:
        load_settings()
    assert info.value.setting == named
    assert says in str(info.value)
    assert "\n" not in str(info.value)


@pytest.mark.parametrize(
    ("url", "kind", "where"),
    [
        ("file:///data/store", "file", "/data/store"),
        ("s3://bucket-1/a/b/", "s3", "bucket-1:a/b"),
        ("s3://bucket-1", "s3", "bucket-1:"),
    ],
)
def test_store_urls(url: str, kind: str, where: str) -> None:
    loc = parse_store_url(url)
    assert loc.kind == kind
    got = str(loc.path) if kind == "file" else f"{loc.bucket}:{loc.prefix}"
    assert got == where


def test_plain_paths_are_local_and_absolute(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    loc = parse_store_url("var/store")
    assert loc.kind == "file"
    assert loc.path == tmp_path / "var" / "store"


def test_corpora_come_from_json(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(
        "RL_EXPORT_CORPORA",
        '[{"name": "passed-human", "source": "human", "filter": {"passed": true}}]',
    )
    (spec,) = load_settings().corpora
    assert (spec.name, spec.source, spec.format) == ("passed-human", "human", "trajectory")
    assert spec.filter == Filters(passed=True)
    assert spec.equals == {}


def test_a_messages_corpus_of_passed_conversations_is_one_line(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv(
        "RL_EXPORT_CORPORA",
        '[{"name":"sft","source":"evaluator","format":"messages","filter":{"passed":true,'
        '"min-reward":0.5,"pass_dimension":["goal_met"],"rules_version":1}}]',
    )
    (spec,) = load_settings().corpora
    assert spec.format == "messages"
    assert spec.filter == Filters(passed=True, min_reward=0.5, pass_dimension=("goal_met",))
    assert spec.equals == {"rules_version": 1}  # the old equality test on a record field


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        ('{"name":"p","source":"human","format":"preference"}', "use rl-export export"),
        ('{"name":"x","source":"human","format":"xml"}', "format 'xml' cannot be a corpus"),
        ('{"name":"x","source":"human","filter":{"min-reward":"abc"}}', "'abc' is not a number"),
        ('{"name":"x","source":"human","filter":{"colour":"red"}}', "'colour' is neither"),
        ('{"name":"x","source":"human","filter":{"limit":3}}', "does not apply to a corpus"),
        ('{"name":"x","source":"human","redact":["emails"]}', "redact: unknown kind 'emails'"),
        ('{"name":"human","source":"human","redact":"pii"}', "'human' is what exports read"),
    ],
)
def test_bad_corpus_specs_say_why(monkeypatch: pytest.MonkeyPatch, spec: str, message: str) -> None:
    monkeypatch.setenv("RL_EXPORT_CORPORA", f"[{spec}]")
    with pytest.raises(ConfigError) as info:
        load_settings()
    assert info.value.setting == "RL_EXPORT_CORPORA"
    assert message in str(info.value)


def test_corpus_specs_redact_as_asked_or_as_the_setting_says(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv(
        "RL_EXPORT_CORPORA",
        '[{"name":"human","source":"human"},{"name":"a","source":null},'
        '{"name":"b","source":null,"redact":["pii"]},{"name":"c","source":null,"redact":"none"},'
        '{"name":"d","source":null,"redact":[]}]',
    )
    specs = {s.name: s.redact for s in load_settings().corpora}
    assert specs == {"human": (), "a": ("secrets",), "b": PII_KINDS, "c": (), "d": ()}
    specs = {s.name: s.redact for s in load_settings(redact="email,ip").corpora}
    assert specs["a"] == ("email", "ip")
    assert specs["human"] == ()  # the default corpora stay verbatim
    assert load_settings(redact="ALL").redact == ",".join(KINDS)
    with pytest.raises(ConfigError, match=r"^RL_EXPORT_REDACT: unknown kind 'emails'"):
        load_settings(redact="emails")


@pytest.mark.parametrize("value", ["not json", '[{"name": "../x", "source": null}]'])
def test_bad_corpora_name_the_variable(monkeypatch: pytest.MonkeyPatch, value: str) -> None:
    monkeypatch.setenv("RL_EXPORT_CORPORA", value)
    with pytest.raises(ConfigError) as info:
        load_settings()
    assert info.value.setting == "RL_EXPORT_CORPORA"


def test_child_env_round_trips_every_setting(monkeypatch: pytest.MonkeyPatch) -> None:
    from rl_export.runtime.childenv import child_env

    original = Settings(
        partitions=3,
        corpora=(  # type: ignore[arg-type]
            {"name": "x", "source": "human"},
            {"name": "y", "source": "evaluator", "format": "kto",
             "filter": {"passed": True, "since": "2026-01-01T00:00:00Z", "rules_version": 1}},
        ),
    )  # fmt: skip
    env = child_env(original, {"PATH": "/bin", "RL_EXPORT_PARTITIONS": "99"}, EXTRA="1")
    assert env["PATH"] == "/bin"
    assert env["EXTRA"] == "1"
    for key in [k for k in os.environ if k.startswith("RL_EXPORT_")]:
        monkeypatch.delenv(key)
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    assert load_settings() == original


def test_warm_projects_are_org_slash_project_names() -> None:
    settings = load_settings(web_warm=" acme/bot, acme/other ,")
    assert settings.web_warm == "acme/bot,acme/other"
    assert settings.warm_projects == (("acme", "bot"), ("acme", "other"))
    assert load_settings().warm_projects == ()
    for bad in ("acme", "acme/bot/x", "acme/../x", "/bot"):
        with pytest.raises(ConfigError, match="RL_EXPORT_WEB_WARM"):
            load_settings(web_warm=bad)
