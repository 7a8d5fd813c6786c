"""A project's labeling guidelines: Markdown rendered on the server to HTML that runs nothing.

The guidelines are an admin's Markdown (docs/guides/rubrics.md), shown beside every item on
the Label page. They are rendered here, once per rubric version, by markdown-it-py (the
CommonMark reference's Python port) with:

* raw HTML off: ``<script>``, ``<img onerror=...>`` and any other tag in the text come out as
  text (escaped), never as markup;
* links only to ``http:`` and ``https:`` URLs (checked after markdown-it's normalising, case
  and spaces included): any other link (``javascript:``, ``data:``, ``vbscript:``, relative,
  ``mailto:``) is left as text; a link gets ``rel="noopener noreferrer nofollow"``;
* images as their alt text: the page loads nothing from elsewhere (its Content-Security-Policy
  would refuse it anyway).

The page puts the result in with ``innerHTML`` only because of these rules, and its CSP
(``script-src 'self'``, no inline script) stands behind them. ``tests/unit/labeling/
test_guidelines.py`` renders hostile Markdown (generated too) and checks that no tag but the
allowed ones and no attribute but ``href``/``rel`` on links (http(s)) come out.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from markdown_it import MarkdownIt
from markdown_it.common.utils import escapeHtml
from markdown_it.renderer import RendererHTML
from markdown_it.token import Token
from markdown_it.utils import EnvType, OptionsDict

ALLOWED_SCHEMES = ("http://", "https://")
LINK_REL = "noopener noreferrer nofollow"


def _safe_link(url: str) -> bool:
    return url.strip().lower().startswith(ALLOWED_SCHEMES)


def _link_open(
    self: RendererHTML, tokens: Sequence[Token], idx: int, options: OptionsDict, env: EnvType
) -> str:
    tokens[idx].attrSet("rel", LINK_REL)
    return self.renderToken(tokens, idx, options, env)


def _image(
    self: RendererHTML, tokens: Sequence[Token], idx: int, options: OptionsDict, env: EnvType
) -> str:
    """An image as its alt text, escaped (the text renderer gives it raw)."""
    children = tokens[idx].children or []
    return escapeHtml(self.renderInlineAsText(children, options, env))


def _parser() -> MarkdownIt:
    md = MarkdownIt("commonmark", {"html": False, "linkify": False, "typographer": False})
    md.validateLink = _safe_link  # type: ignore[method-assign]
    md.add_render_rule("link_open", _link_open)
    md.add_render_rule("image", _image)
    return md


_MD = _parser()


def render_guidelines(text: str) -> str:
    """The guidelines' Markdown as safe HTML (see the module)."""
    if not text.strip():
        return ""
    return str(_MD.render(text))


def guidelines_fields(text: str) -> dict[str, Any]:
    """``guidelines`` and ``guidelines_html`` of an API answer."""
    return {"guidelines": text, "guidelines_html": render_guidelines(text)}
