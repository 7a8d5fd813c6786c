"""The environment that configures a child process exactly like its parent's settings."""

from __future__ import annotations

import json
from collections.abc import Mapping

from rl_export.runtime.settings import ENV_PREFIX, Settings, env_name


def child_env(settings: Settings, base: Mapping[str, str], **extra: str) -> dict[str, str]:
    """The environment that configures a child process exactly like ``settings``.

    ``base`` (usually ``os.environ``) is kept except for its ``RL_EXPORT_`` variables;
    ``extra`` is applied last.
    """
    env = {k: v for k, v in base.items() if not k.startswith(ENV_PREFIX)}
    for name, value in settings.model_dump(mode="json").items():
        if value is None:  # unset optional settings stay unset (the child's default)
            continue
        env[env_name(name)] = value if isinstance(value, str) else json.dumps(value)
    env.update(extra)
    return env
