"""The web process's logs never show a token, even one a client put in a query string."""

from __future__ import annotations

import logging

import pytest

from rl_export.web.main import HideTokens

TOKEN = "rlx_0123456789ab_" + "S3cr3t-value_" * 3 + "abcd"


def test_a_token_in_an_access_line_is_masked(caplog: pytest.LogCaptureFixture) -> None:
    logger = logging.getLogger("test.rl_export.access")
    logger.addFilter(HideTokens())
    with caplog.at_level(logging.INFO, logger=logger.name):
        logger.info('%s - "%s %s HTTP/%s" %d', "127.0.0.1:5000", "GET",
                    f"/api/v1/acme/bot/stats?token={TOKEN}", "1.1", 422)  # fmt: skip
        logger.info(f"odd line with {TOKEN} inline")
    assert TOKEN not in caplog.text
    assert "S3cr3t" not in caplog.text
    assert "rlx_0123456789ab_***" in caplog.text
    assert "/api/v1/acme/bot/stats?token=" in caplog.text
