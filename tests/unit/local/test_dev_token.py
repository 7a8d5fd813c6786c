"""``rl-export dev``'s token and store (issue 56): the token of the last start is reused while
it is valid, a new one revokes the one it replaces, and ``--data-dir`` moves the store."""

from __future__ import annotations

import os
import stat
import subprocess
import sys
from pathlib import Path

from rl_export.local.dev import TOKEN_FILE, dev_store_url, dev_token, token_id
from rl_export.runtime.settings import Settings


def tokens(env: dict[str, str], *args: str) -> str:
    argv = [sys.executable, "-m", "rl_export.cli", "tokens", *args]
    done = subprocess.run(argv, env=env, capture_output=True, text=True, check=True, timeout=60)
    return done.stdout


def state_of(env: dict[str, str], token: str) -> str:
    line = next(x for x in tokens(env, "list").splitlines() if x.startswith(token_id(token) or "?"))
    return "active" if line.endswith(" active") else "revoked" if " revoked " in line else line


def test_the_token_is_reused_and_what_it_replaces_revoked(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("RL_EXPORT_")}
    env["RL_EXPORT_STORE_URL"] = str(tmp_path / "store")
    data = tmp_path / "var"
    first, fresh = dev_token(env, data)
    assert fresh
    assert stat.S_IMODE((data / TOKEN_FILE).stat().st_mode) == 0o600
    again, fresh = dev_token(env, data)
    assert (again, fresh) == (first, False)  # no new 90-day token at every start
    # A token of an older stack (fewer scopes), or revoked, is replaced, and revoked.
    older = tokens(env, "create", "--org", "acme", "--project", "support-bot", "--subject",
                   "dev", "--scopes", "admin,raw").strip().splitlines()[-1]  # fmt: skip
    (data / TOKEN_FILE).write_text(older + "\n")
    made, fresh = dev_token(env, data)
    assert fresh
    assert made not in (first, older)
    assert state_of(env, older) == "revoked"
    assert state_of(env, made) == "active"
    tokens(env, "revoke", token_id(made) or "")
    assert dev_token(env, data)[0] != made


def test_the_data_dir_holds_the_store_unless_a_store_is_named(tmp_path: Path) -> None:
    assert dev_store_url(Settings(data_dir=tmp_path)) == str(tmp_path.resolve() / "store")
    named = Settings(data_dir=tmp_path, store_url="s3://bucket/dev")
    assert dev_store_url(named) == "s3://bucket/dev"
