"""The guidelines' Markdown rendered to HTML that runs nothing (labeling/guidelines.py): only a
few tags come out, links only to http(s), no event handler, style or source attribute, whatever
the Markdown (hostile cases listed, and generated from their fragments)."""

from __future__ import annotations

from html.parser import HTMLParser

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rl_export.labeling.guidelines import render_guidelines

TAGS = {"p", "h1", "h2", "h3", "h4", "h5", "h6", "em", "strong", "code", "pre", "blockquote",
        "ul", "ol", "li", "a", "hr", "br"}  # fmt: skip
ATTRIBUTES = {"a": {"href", "rel", "title"}, "ol": {"start"}, "code": {"class"}}


class Found(HTMLParser):
    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.tags: list[tuple[str, list[tuple[str, str | None]]]] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self.tags.append((tag, attrs))

    def handle_startendtag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self.tags.append((tag, attrs))


def assert_safe(markdown: str) -> str:
    html = render_guidelines(markdown)
    found = Found()
    found.feed(html)
    for tag, attrs in found.tags:
        assert tag in TAGS, (tag, markdown)
        for name, value in attrs:
            assert name in ATTRIBUTES.get(tag, set()), (tag, name, markdown)
            if name == "href":
                assert (value or "").lower().startswith(("http://", "https://")), (value, markdown)
            if name == "class":
                assert (value or "").startswith("language-"), value
    assert "<script" not in html.lower()
    return html


HOSTILE = [
    "<script>alert(1)</script>",
    "<img src=x onerror=alert(1)>",
    "[click](javascript:alert(1))",
    "[click]( JaVaScRiPt:alert(1))",
    "[click](java\nscript:alert(1))",
    "[click](&#106;avascript:alert(1))",
    "[click](data:text/html;base64,PHNjcmlwdD4=)",
    "[click](vbscript:msgbox)",
    "[click](//evil.example/x)",
    "[click](/relative)",
    "![<img src=x onerror=alert(1)>](http://a/b.png)",
    "![x](javascript:alert(1))",
    '[t](https://a "x\\" onclick=\\"y")',
    "<a href='javascript:alert(1)'>x</a>",
    '```js" onmouseover="alert(1)\n<b>\n```',
    "<div style='background:url(javascript:alert(1))'>x</div>",
    "<https://ok.example/?q=<script>>",
    "<javascript:alert(1)>",
    "[a]: javascript:alert(1)\n\n[a]",
    "<iframe src='https://evil'></iframe>",
]


@pytest.mark.parametrize("markdown", HOSTILE)
def test_hostile_markdown_runs_nothing(markdown: str) -> None:
    assert_safe(markdown)


def test_links_to_http_and_https_stay_links_with_a_rel() -> None:
    html = assert_safe("[docs](https://example.com/guide) and <http://example.org>")
    assert html.count("<a ") == 2
    assert 'rel="noopener noreferrer nofollow"' in html
    assert render_guidelines("   ") == ""


def test_what_guidelines_are_made_of_comes_out() -> None:
    html = assert_safe("# Rate\n\n1. **Correct**: facts\n2. *Kind*\n\n> quote\n\n`code`\n\n---")
    for tag in ("<h1>", "<ol>", "<strong>", "<em>", "<blockquote>", "<code>", "<hr />"):
        assert tag in html


FRAGMENTS = st.sampled_from(
    ["<", ">", "script", "img", " src=x ", "onerror=", "alert(1)", "javascript:", "data:",
     "[", "]", "(", ")", "!", '"', "'", "`", "```", "\n", "&#106;", "https://a.b/", "*", "#",
     " ", "<a href=", "style=", "{", "}", "&", ";", "\\", "onclick"]
)  # fmt: skip


@settings(max_examples=500, deadline=None)
@given(st.lists(FRAGMENTS, max_size=40).map("".join))
def test_generated_hostile_markdown_runs_nothing(markdown: str) -> None:
    assert_safe(markdown)
