"""Where OAUTHBEARER tokens come from: a file read for every connection, or AWS's signer.

:class:`~rl_export.kafka.client.KafkaConnection` gives aiokafka and librdkafka these: a
token mounted as a file that something else keeps fresh, or (``AWS_MSK_IAM``) a token the
maintained signer (``aws-msk-iam-sasl-signer-python``, the ``msk`` extra) signs from the
process's AWS credentials.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable

from aiokafka.abc import AbstractTokenProvider

from rl_export.model.errors import ConfigError
from rl_export.runtime.settings import env_name

# An MSK IAM token lives 15 minutes: sign a new one when less than this is left.
_MSK_RENEW_BEFORE_S = 60.0


class FileToken(AbstractTokenProvider):  # type: ignore[misc]  # aiokafka is untyped
    """OAUTHBEARER: the token is read from its source for every new connection."""

    def __init__(self, read: Callable[[], str]) -> None:
        self._read = read

    async def token(self) -> str:
        return self._read()


class MskIamToken:
    """AWS_MSK_IAM: a token signed from the AWS credentials, renewed before it expires.

    The signer resolves the credentials (which may ask the instance metadata service or
    STS) and signs locally; aiokafka asks :meth:`token` for each new connection, librdkafka
    calls :meth:`oauth_cb` when the token nears its end.
    """

    def __init__(self, region: str) -> None:
        try:
            from aws_msk_iam_sasl_signer import MSKAuthTokenProvider
        except ImportError:
            raise ConfigError(
                env_name("kafka_sasl_mechanism"),
                "AWS_MSK_IAM needs the msk extra: pip install 'rl-export[msk]'",
            ) from None
        self._sign: Callable[[str], tuple[str, int]] = MSKAuthTokenProvider.generate_auth_token
        self.region = region
        self._token: tuple[str, float] | None = None  # (token, expiry as a Unix time)

    def current(self) -> tuple[str, float]:
        """A token valid for a minute at least, and when it expires (Unix time, seconds)."""
        if self._token is None or self._token[1] - _MSK_RENEW_BEFORE_S <= time.time():
            token, expiry_ms = self._sign(self.region)
            self._token = (token, expiry_ms / 1000)
        return self._token

    async def token(self) -> str:
        return (await asyncio.to_thread(self.current))[0]

    def oauth_cb(self, _config: str) -> tuple[str, float]:
        return self.current()


class MskAiokafkaToken(AbstractTokenProvider):  # type: ignore[misc]  # aiokafka is untyped
    def __init__(self, signer: MskIamToken) -> None:
        self._signer = signer

    async def token(self) -> str:
        return await self._signer.token()
