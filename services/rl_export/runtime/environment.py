"""Settings from the environment: the variable of a setting, and loading them with a
one-line error (the environment that gives a child process the same settings is
:mod:`rl_export.runtime.childenv`'s).

The settings themselves are :class:`rl_export.runtime.settings.Settings` (which re-exports
these names, so ``from rl_export.runtime.settings import load_settings`` keeps working).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from pydantic import ValidationError
from pydantic_settings import SettingsError

from rl_export.model.errors import ConfigError

if TYPE_CHECKING:
    from rl_export.runtime.settings import Settings

ENV_PREFIX = "RL_EXPORT_"


def env_name(field: str) -> str:
    """Return the environment variable that sets ``field``."""
    return f"{ENV_PREFIX}{field.upper()}"


def load_settings(**overrides: Any) -> Settings:
    """Load settings from the environment, apply overrides, and report errors as ConfigError.

    The error names the environment variable of the first invalid setting, so the command
    line can print one line instead of a validation traceback.
    """
    from rl_export.runtime.settings import Settings  # the class imports this module

    clean = {k: v for k, v in overrides.items() if v is not None}
    try:
        return Settings(**clean)
    except SettingsError as exc:  # a complex value (e.g. corpora) that is not valid JSON
        field = str(exc).split('"')[1] if '"' in str(exc) else "settings"
        raise ConfigError(env_name(field), "not valid JSON") from None
    except ValidationError as exc:
        first = exc.errors()[0]
        message = str(first["msg"]).removeprefix("Value error, ")
        if not first["loc"] and message.startswith(ENV_PREFIX):  # a check across settings
            variable, _, detail = message.partition(": ")
            raise ConfigError(variable, detail) from None
        field = str(first["loc"][0]) if first["loc"] else "settings"
        raise ConfigError(env_name(field), message) from None
