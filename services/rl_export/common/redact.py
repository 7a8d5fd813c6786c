"""Redaction (DESIGN.md section 4): sensitive substrings of a row's free text become
``[REDACTED:KIND]``, deterministically, with a count per kind.

Pure: text in, text and counts out (:meth:`Redactor.text`); a record or row in, a record and
counts out (:meth:`Redactor.record`); a JSON Lines line in, a line and counts out
(:meth:`Redactor.line`). One module serves the sink (corpus specs with ``redact``) and the
exports, so it sits below both.

Kinds (:data:`KINDS`) and who detects them, all kept libraries run without any NLP model:

- ``secrets``: bc-detect-secrets' plugins (cloud and SaaS keys, tokens, private key blocks,
  JWTs, passwords in URLs, and the keyword detector: values assigned to key, secret, token or
  password names, kept when their Shannon entropy says they are not a word or a
  placeholder), plus the recognizers of :data:`EXTRA_SECRETS` for key formats the fork has
  no plugin for (OpenAI and Anthropic, Google, GitLab, Hugging Face, fine-grained GitHub
  tokens, bearer tokens).
- ``email``, ``phone``, ``credit_card`` (Luhn-valid), ``iban`` (checksum-valid), ``ip``:
  Presidio's predefined pattern recognizers, constructed directly (no ``AnalyzerEngine``,
  so no spaCy pipeline and no model download). A phone must hold at least 7 digits and be
  written with a ``+`` or separators: a bare run of digits is an order number as often as a
  phone.

The replacement is :func:`replace_spans` (overlapping findings become one placeholder), not
presidio-anonymizer: that package imports presidio-analyzer and with it spaCy (seconds of
CPU and about 100 MB) only to splice strings, which the default ``secrets`` never needs.

Which strings (:meth:`Redactor.record`): message ``content`` (a string, or the ``text`` of
its parts, ``tool_result`` parts' content and ``tool_use`` parts' ``input``), tool-call
``arguments`` (a JSON string stays valid JSON: its string values are redacted and it is
encoded again, only when something changed), message ``metadata`` string values, evaluation
``reasoning`` and assessment ``explanation``, label ``comment``, a record's ``metadata``
string values. Never keys, ids, roles, names, numbers or datetimes.

Speed: a cheap pre-filter (:class:`Gates`, one RE2 automaton per kind, and a detector runs
only on text its kind's gate matches) keeps text without any candidate away from the
detectors, and :meth:`Redactor.line` keeps a JSON line without any candidate from being
parsed. The libraries are imported on first use (Presidio's imports spaCy: seconds of CPU);
:func:`warm_up` does it ahead, for a server.
"""

from __future__ import annotations

import functools
import json
import math
import re
from collections import Counter
from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import Any

import orjson

from rl_export.common.codec import RawJson, dumps_line
from rl_export.common.errors import ExportError
from rl_export.common.metrics import REDACTION_KINDS

KINDS: tuple[str, ...] = REDACTION_KINDS
"""``secrets``, ``email``, ``phone``, ``credit_card``, ``iban``, ``ip``."""
PII_KINDS: tuple[str, ...] = tuple(k for k in KINDS if k != "secrets")
ALIASES: dict[str, tuple[str, ...]] = {"none": (), "all": KINDS, "pii": PII_KINDS}
DEFAULT_REDACT = "secrets"

Counts = dict[str, int]
_NO_COUNTS: Counts = {}


class RedactError(ExportError):
    """An unknown redaction kind; ``setting`` names where it was given (``redact``)."""


def placeholder(kind: str) -> str:
    """What a substring of ``kind`` becomes: ``[REDACTED:EMAIL]``."""
    return f"[REDACTED:{kind.upper()}]"


def parse_kinds(value: str | Iterable[str] | None, *, setting: str = "redact") -> tuple[str, ...]:
    """``secrets,email`` / ``pii`` / ``all`` / ``none`` (or a list of them) -> the kinds, in
    :data:`KINDS` order; None is the default (``secrets``). RedactError names ``setting``."""
    if value is None:
        value = DEFAULT_REDACT
    items = value.split(",") if isinstance(value, str) else list(value)
    names = [str(i).strip().lower() for i in items if str(i).strip()]
    chosen: set[str] = set()
    for name in names:
        if name in ALIASES:
            if name == "none" and len(names) > 1:
                raise RedactError(setting, "'none' cannot be combined with other kinds")
            chosen.update(ALIASES[name])
        elif name in KINDS:
            chosen.add(name)
        else:
            raise RedactError(
                setting,
                f"unknown kind {name!r} (kinds: {', '.join(KINDS)}; or pii, all, none)",
            )
    return tuple(k for k in KINDS if k in chosen)


def add_counts(total: Counter[str] | dict[str, int], counts: Counts) -> None:
    """Add ``counts`` into ``total``."""
    for kind, n in counts.items():
        total[kind] = total.get(kind, 0) + n


def counts_header(counts: Counts) -> str:
    """The ``X-RL-Export-Redactions`` value: every kind asked for, in order, as JSON."""
    return json.dumps(counts, separators=(",", ":"))


# --- gates: cheap necessary conditions, one per kind ---------------------------------------

# Each gate is an RE2 pattern (linear time, no look-around) using only characters JSON never
# escapes (no quote, backslash, slash or control character), so a gate that matches a string
# also matches the JSON line that holds it (:meth:`Redactor.line`; lines with \u or \/
# escapes are always parsed). A detector runs on a string only when its kind's gate matches.
# The words of the keyword detector's names and of the plugins that look for a name before
# their secret. A bare 'pass' only before an assignment (the plugins that take it want one):
# a record's "passed" and "pass_threshold" are no secrets.
_SECRET_WORDS = (
    "key|pwd|pw|password|passwd|_pass(?:[^A-Za-z0-9_]|$)|(?:db|database|key)_?pass|"
    r"pass[\\\"'\[\]]{0,4} *(?:[=:]| )|token|secret|auth|bearer|aws|contrase|credential|"
    "artif|jfrog|buildkit|npm"
)
GATES: dict[str, str] = {
    "secrets": (
        f"(?i:{_SECRET_WORDS})|A3T|ABIA|ACCA|AKIA|ASIA|AKC|eyJ|BEGIN|PuTTY|"
        r"gh[pousr]_|github_pat_|(?i:xox[abposr]-)|hooks\.slack\.com|SG\.|[rs]k_live_|"
        r"sq0csp-|AC[a-z0-9]{32}|SK[a-z0-9]{32}|://|-us[0-9]|"
        r"[MNO][a-zA-Z0-9_-]{23,25}\.|sk-|AIza|glpat-|hf_"
    ),
    "email": "@",
    # At least 7 digits in a run of digits and phone punctuation (python-phonenumbers'
    # VALID_PUNCTUATION; PhoneRecognizer's results are kept only in that shape: _phone_ok).
    "phone": r"\p{Nd}(?:[ \t\-x\x{2010}-\x{2015}\x{2212}\x{30FC}\x{FF0D}-\x{FF0F}\x{00A0}"
    r"\x{00AD}\x{200B}\x{2060}\x{3000}()\x{FF08}\x{FF09}\x{FF3B}\x{FF3D}.\[\]/~\x{2053}"
    r"\x{223C}\x{FF5E}+]{0,4}\p{Nd}){6,}",
    # CreditCardRecognizer's pattern starts with 4 digits, a separator or not, 3 digits.
    "credit_card": r"\p{Nd}{4}[ -]?\p{Nd}{3}",
    # IbanRecognizer's pattern starts with a country code and two check digits.
    "iban": r"[A-Z]{2}[0-9]{2}",
    # IpRecognizer's IPv4 forms hold a dotted quad; its IPv6 forms hold '::' or, written in
    # full, four groups followed by a colon.
    "ip": r"[0-9]{1,3}\.[0-9]{1,3}\.[0-9]{1,3}\.[0-9]{1,3}|::|"
    r"[0-9A-Fa-f]{1,4}:[0-9A-Fa-f]{1,4}:[0-9A-Fa-f]{1,4}:[0-9A-Fa-f]{1,4}:",
}


class Gates:
    """The gates of some kinds: one automaton for all of them, and one per kind."""

    def __init__(self, kinds: Sequence[str]) -> None:
        import re2  # google-re2: an alternation of dozens of words at automaton speed

        options = re2.Options()
        options.max_mem = 64 << 20
        self.kinds = tuple(kinds)
        self.any = re2.compile("|".join(f"(?:{GATES[k]})" for k in kinds), options)
        self.each = {k: re2.compile(GATES[k], options) for k in kinds}

    def open(self, text: str) -> bool:
        """True when some kind's gate matches."""
        return bool(self.kinds) and self.any.search(text) is not None

    def which(self, text: str) -> list[str]:
        """The kinds whose gate matches."""
        return [k for k in self.kinds if self.each[k].search(text) is not None]


# --- detectors ------------------------------------------------------------------------------

Span = tuple[int, int, str]  # start, end, kind

EXTRA_SECRETS: dict[str, str] = {
    # Formats bc-detect-secrets 1.5 has no plugin for (its GitHub plugin knows the classic
    # gh*_ tokens only).
    "OpenAI or Anthropic API key": r"\bsk-(?:proj-|ant-(?:api03-)?|svcacct-|admin-)?"
    r"[A-Za-z0-9_-]{20,}",
    "Google API key": r"\bAIza[0-9A-Za-z_-]{35}",
    "GitLab token": r"\bglpat-[0-9A-Za-z_-]{20,}",
    "Hugging Face token": r"\bhf_[A-Za-z0-9]{30,}",
    "GitHub fine-grained token": r"\bgithub_pat_[A-Za-z0-9_]{22,}",
    "Bearer token": r"(?i:\bbearer\s+)([A-Za-z0-9._~+/-]{20,}=*)",
}
_KEYWORD_MIN_ENTROPY = 2.5  # bits per character: 'hunter2' is 2.8, 'changeme' 2.75
_KEYWORD_MIN_LENGTH = 6


def _entropy(value: str) -> float:
    counts = Counter(value)
    n = len(value)
    return -sum(c / n * math.log2(c / n) for c in counts.values())


class _Secrets:
    """bc-detect-secrets' plugins, called on strings (never their network verification)."""

    def __init__(self) -> None:
        from detect_secrets.filters import heuristic
        from detect_secrets.plugins.artifactory import ArtifactoryDetector
        from detect_secrets.plugins.aws import AWSKeyDetector
        from detect_secrets.plugins.basic_auth import BasicAuthDetector
        from detect_secrets.plugins.cloudant import CloudantDetector
        from detect_secrets.plugins.discord import DiscordBotTokenDetector
        from detect_secrets.plugins.github_token import GitHubTokenDetector
        from detect_secrets.plugins.ibm_cloud_iam import IbmCloudIamDetector
        from detect_secrets.plugins.ibm_cos_hmac import IbmCosHmacDetector
        from detect_secrets.plugins.jwt import JwtTokenDetector
        from detect_secrets.plugins.keyword import (
            CONFIG_DENYLIST_REGEX_TO_GROUP,
            QUOTES_REQUIRED_DENYLIST_REGEX_TO_GROUP,
            KeywordDetector,
        )
        from detect_secrets.plugins.mailchimp import MailchimpDetector
        from detect_secrets.plugins.npm import NpmDetector
        from detect_secrets.plugins.private_key import PrivateKeyDetector
        from detect_secrets.plugins.sendgrid import SendGridDetector
        from detect_secrets.plugins.slack import SlackDetector
        from detect_secrets.plugins.softlayer import SoftlayerDetector
        from detect_secrets.plugins.square_oauth import SquareOAuthDetector
        from detect_secrets.plugins.stripe import StripeDetector
        from detect_secrets.plugins.twilio import TwilioKeyDetector

        # Not the generic high-entropy plugins (they take every hash and UUID for a secret),
        # nor Azure's (its bare pattern is any 88-character base64 string: a SHA-512).
        self.plugins = [
            p()
            for p in (
                ArtifactoryDetector, AWSKeyDetector, BasicAuthDetector, CloudantDetector,
                DiscordBotTokenDetector, GitHubTokenDetector, IbmCloudIamDetector,
                IbmCosHmacDetector, JwtTokenDetector, MailchimpDetector, NpmDetector,
                PrivateKeyDetector, SendGridDetector, SlackDetector, SoftlayerDetector,
                SquareOAuthDetector, StripeDetector, TwilioKeyDetector,
            )
        ]  # fmt: skip
        self.private_key = next(p for p in self.plugins if isinstance(p, PrivateKeyDetector))
        self.keyword = KeywordDetector()
        self.keyword_rules = (
            QUOTES_REQUIRED_DENYLIST_REGEX_TO_GROUP,
            CONFIG_DENYLIST_REGEX_TO_GROUP,
        )
        self.placeholder_like = (
            heuristic.is_templated_secret, heuristic.is_sequential_string,
            heuristic.is_potential_uuid,
        )  # fmt: skip
        self.extra = [re.compile(p) for p in EXTRA_SECRETS.values()]
        self.pem = re.compile(
            r"-----BEGIN[A-Z0-9 ]*PRIVATE KEY( BLOCK)?-----.*?"
            r"(?:-----END[A-Z0-9 ]*PRIVATE KEY( BLOCK)?-----|\Z)",
            re.DOTALL,
        )

    def keyword_values(self, text: str) -> set[str]:
        """Values assigned to key, secret, token or password names, high-entropy ones."""
        found: set[str] = set()
        for rules in self.keyword_rules:
            for found_value in self.keyword.analyze_string(text, denylist_regex_to_group=rules):
                value = found_value.strip()
                if (
                    len(value) >= _KEYWORD_MIN_LENGTH
                    and _entropy(value) >= _KEYWORD_MIN_ENTROPY
                    and not value.startswith("[REDACTED:")
                    and not any(check(value) for check in self.placeholder_like)
                ):
                    found.add(value)
        return found

    def spans(
        self, text: str, windows: Iterable[tuple[int, int]], values: Iterable[str] = ()
    ) -> list[Span]:
        """Where the secrets in the windows of ``text`` (and the given values anywhere in it)
        are; a private key block, from its BEGIN line to its END line, anywhere."""
        spans: list[Span] = []
        keyword: set[str] = set(values)
        for offset, piece in [(a, text[a:b]) for a, b in windows]:
            for plugin in self.plugins:
                if plugin is self.private_key:
                    continue  # a block can be longer than any window: the whole text, below
                found = set(plugin.analyze_string(piece))  # what the plugin vouches for
                if found:
                    spans += _plugin_spans(piece, plugin.denylist, found, offset)
            for pattern in self.extra:
                for match in pattern.finditer(piece):
                    group = match.lastindex or 0
                    spans.append(
                        (offset + match.start(group), offset + match.end(group), "secrets")
                    )
            keyword |= self.keyword_values(piece)
        if "PRIVATE KEY" in text or "PuTTY" in text:
            found = set(self.private_key.analyze_string(text))
            if found:
                keys = _plugin_spans(text, self.private_key.denylist, found)
                spans += keys + [
                    (m.start(), m.end(), "secrets")
                    for m in self.pem.finditer(text)
                    if any(a < m.end() and m.start() < b for a, b, _ in keys)
                ]
        for value in sorted(keyword, key=lambda v: (-len(v), v)):
            spans += [(i, i + len(value), "secrets") for i in _find_all(text, value)]
        return spans


_DELIMITERS = " \t\r\n\"'=:`"


def _plugin_spans(
    text: str, denylist: Iterable[Any], found: set[str], offset: int = 0
) -> list[Span]:
    """Where a plugin's patterns matched a value it vouched for. A plugin yields a pattern's
    groups (the secret after its name, or only a token's prefix: GitHub's ``ghp``), so the
    span is the longest group when it is a secret's length, else the whole match, without
    the delimiters some patterns take in."""
    spans: list[Span] = []
    for regex in denylist:
        for match in regex.finditer(text):
            groups = [i for i in range(1, regex.groups + 1) if match.start(i) >= 0]
            if not found & {match.group(0), *(match.group(i) for i in groups)}:
                continue
            longest = max(groups, key=lambda i: match.end(i) - match.start(i), default=0)
            if match.end(longest) - match.start(longest) < 8:
                longest = 0
            start, end = match.start(longest), match.end(longest)
            while start < end and text[start] in _DELIMITERS:
                start += 1
            while end > start and text[end - 1] in _DELIMITERS:
                end -= 1
            if start < end:
                spans.append((offset + start, offset + end, "secrets"))
    return spans


_DIGIT_KINDS = frozenset({"phone", "credit_card"})
_DATE = re.compile(rb"\d{4}-\d\d-\d\d")
_DATETIME = re.compile(
    r"\d{4}-\d\d-\d\d(?:[T ]\d\d:\d\d(?::\d\d(?:[.,]\d+)?)?(?:Z|[+-]\d\d(?::?\d\d)?)?)?"
)


def _phone_ok(found: str) -> bool:
    """A phone has at least 7 digits and a ``+`` or a separator (a bare run of digits is an
    order number as often as a phone)."""
    digits = sum(c.isdigit() for c in found)
    return digits >= 7 and digits < len(found)


class _Presidio:
    """Presidio's predefined pattern recognizers, constructed without an NLP engine."""

    def __init__(self) -> None:
        import tldextract
        from presidio_analyzer.predefined_recognizers import (
            CreditCardRecognizer,
            EmailRecognizer,
            IbanRecognizer,
            IpRecognizer,
            PhoneRecognizer,
        )

        # The public-suffix list bundled with tldextract: it would otherwise try to fetch
        # the latest one over the network at first use.
        offline = tldextract.TLDExtract(suffix_list_urls=(), cache_dir=None)

        class OfflineEmailRecognizer(EmailRecognizer):
            def validate_result(self, pattern_text: str) -> bool:
                return offline(pattern_text).fqdn != ""

        self.recognizers: dict[str, Any] = {
            "email": OfflineEmailRecognizer(),
            "phone": PhoneRecognizer(),
            "credit_card": CreditCardRecognizer(),
            "iban": IbanRecognizer(),
            "ip": IpRecognizer(),
        }
        self.min_score = 0.3  # IpRecognizer scores a bare '::' 0.1

    def spans(self, text: str, kind: str, windows: Iterable[tuple[int, int]]) -> list[Span]:
        """The kind's findings in the given windows of ``text``."""
        recognizer = self.recognizers[kind]
        out: list[Span] = []
        for offset, piece in [(a, text[a:b]) for a, b in windows]:
            for result in recognizer.analyze(piece, recognizer.supported_entities, None):
                if result.score < self.min_score:
                    continue
                if kind == "phone" and not _phone_ok(piece[result.start : result.end]):
                    continue
                out.append((offset + result.start, offset + result.end, kind))
        return out


# How far around a gate's match its detector looks: more than the longest thing it finds
# (an IBAN is up to 34 characters and 8 spaces; an e-mail's local part up to 64), or, for
# secrets, the reach of the plugins' patterns (a name, an assignment, the value after it).
_MARGINS = {"secrets": 320, "email": 100, "phone": 24, "credit_card": 32, "iban": 48, "ip": 48}


def _widen(
    text: str, windows: Iterable[tuple[int, int]], margin: int = 24
) -> list[tuple[int, int]]:
    """Windows grown by ``margin`` characters each side and on to the next space (at most
    another ``margin``: a token is not cut), merged."""
    out: list[tuple[int, int]] = []
    size = len(text)
    for a, b in sorted(windows):
        start = max(0, a - margin)
        if start > 0:
            space = text.rfind(" ", max(0, start - margin), start)
            start = space + 1 if space >= 0 else max(0, start - margin)
        end = min(size, b + margin)
        if end < size:
            space = text.find(" ", end, end + margin)
            end = space if space >= 0 else min(size, end + margin)
        if out and start <= out[-1][1]:
            out[-1] = (out[-1][0], max(out[-1][1], end))
        else:
            out.append((start, end))
    return out


@functools.cache
def _secrets() -> _Secrets:
    return _Secrets()


@functools.cache
def _presidio() -> _Presidio:
    return _Presidio()


def replace_spans(text: str, spans: Sequence[Span]) -> tuple[str, Counts]:
    """``text`` with each span replaced by its kind's placeholder, and the count per kind.

    Overlapping spans become one, of the kind of the span that starts first (the longer one
    at the same start; then secrets before the others): one substring, one count.
    """
    if not spans:
        return text, _NO_COUNTS
    order = {k: n for n, k in enumerate(KINDS)}
    merged: list[list[Any]] = []
    for start, end, kind in sorted(set(spans), key=lambda s: (s[0], -s[1], order[s[2]])):
        if merged and start < merged[-1][1]:
            merged[-1][1] = max(merged[-1][1], end)
        else:
            merged.append([start, end, kind])
    pieces: list[str] = []
    counts: Counts = {}
    at = 0
    for start, end, kind in merged:
        pieces += [text[at:start], placeholder(kind)]
        counts[kind] = counts.get(kind, 0) + 1
        at = end
    pieces.append(text[at:])
    return "".join(pieces), counts


# --- the redactor ---------------------------------------------------------------------------


class _Pass:
    """One walk over a record's places: gathering its strings (``dry``), or redacting."""

    __slots__ = ("counts", "dry", "forced", "texts")

    def __init__(self, *, dry: bool) -> None:
        self.dry = dry
        self.texts: list[str] = []
        self.forced = False  # an escape in gathered JSON text could hide a gate's match
        self.counts: Counter[str] = Counter()

    def gather_json(self, text: str) -> None:
        """JSON text gathered whole (a superset of its strings)."""
        self.texts.append(text)
        if "\\u" in text or "\\/" in text:
            self.forced = True


class Redactor:
    """Redacts the kinds it was made for; pure and deterministic. ``bool(redactor)`` is
    False when it redacts nothing (``none``)."""

    def __init__(self, kinds: Sequence[str]) -> None:
        unknown = [k for k in kinds if k not in KINDS]
        if unknown:
            raise RedactError("redact", f"unknown kind {unknown[0]!r}")
        self.kinds = tuple(k for k in KINDS if k in kinds)
        self.gates = Gates(self.kinds)
        # The gates run on a line's bytes too (:meth:`next_hit`), where an escape (\u, \/)
        # counts as a match: a line none opens for is not parsed.
        self._line_gate: Any = None
        if self.kinds:
            import re2

            options = re2.Options()
            options.max_mem = 64 << 20
            pattern = "|".join(f"(?:{GATES[k]})" for k in self.kinds) + r"|\\u|\\/"
            self._line_gate = re2.compile(pattern.encode(), options)

    def __bool__(self) -> bool:
        return bool(self.kinds)

    def __repr__(self) -> str:
        return f"Redactor({','.join(self.kinds) or 'none'})"

    # text

    def spans(self, text: str, secret_values: Iterable[str] = ()) -> list[Span]:
        """Where the sensitive substrings of ``text`` are (overlaps possible)."""
        values = list(secret_values) if "secrets" in self.kinds else []
        if not values and not self.gates.open(text):
            return []
        spans: list[Span] = []
        for kind in self.gates.which(text):
            # The detectors run on windows around their gate's matches: their patterns cost
            # milliseconds on a long text (Presidio's e-mail pattern backtracks over every
            # word, phonenumbers' matcher runs once per region), little on a window.
            found = [m.span() for m in self.gates.each[kind].finditer(text)]
            windows = _widen(text, found, _MARGINS[kind])
            if kind == "secrets":
                spans += _secrets().spans(text, windows, values)
                values = []
            else:
                spans += _presidio().spans(text, kind, windows)
        if values:  # found in the text around this one (a JSON object's other keys)
            spans += [(i, i + len(v), "secrets") for v in values for i in _find_all(text, v)]
        if any(k in _DIGIT_KINDS for _, _, k in spans):
            # Digits inside a date or a datetime are never a phone or a card number.
            dates = [m.span() for m in _DATETIME.finditer(text)]
            spans = [
                s for s in spans
                if s[2] not in _DIGIT_KINDS or not any(a < s[1] and s[0] < b for a, b in dates)
            ]  # fmt: skip
        secret = [(a, b) for a, b, k in spans if k == "secrets"]
        if secret and len(secret) < len(spans):
            # A secret wins over what overlaps it: 'https://user:pw@host' is a password in a
            # URL, not an e-mail address.
            spans = [
                s for s in spans
                if s[2] == "secrets" or not any(a < s[1] and s[0] < b for a, b in secret)
            ]  # fmt: skip
        return spans

    def text(self, text: str, secret_values: Iterable[str] = ()) -> tuple[str, Counts]:
        """``text`` redacted, and how many substrings of each kind were replaced."""
        return replace_spans(text, self.spans(text, secret_values))

    # records

    def record(self, record: dict[str, Any]) -> tuple[dict[str, Any], Counts]:
        """A record or row with the strings of DESIGN.md section 4 redacted (a new dict when
        something changed, else ``record`` itself), and the counts.

        First the strings are only gathered and the gates tried on all of them at once; the
        detectors run only when one opens."""
        if not self.kinds:
            return record, _NO_COUNTS
        gather = _Pass(dry=True)
        _gather(record, gather)
        if not gather.forced and not self.gates.open("\n".join(gather.texts)):
            return record, _NO_COUNTS
        work = _Pass(dry=False)
        return self._walk(record, work), dict(work.counts)

    def _walk(self, record: dict[str, Any], p: _Pass) -> dict[str, Any]:
        out = dict(record)
        changed = False
        for key in _MESSAGE_KEYS:
            if key in record:
                new = self._messages(record[key], p)
                if new is not record[key]:
                    out[key], changed = new, True
        for key in ("evaluation", "labels", "metadata", "report", "results"):
            if key in record:
                new = _PLACES[key](self, record[key], p)
                if new is not record[key]:
                    out[key], changed = new, True
        return out if changed else record

    def line(self, line: bytes) -> tuple[bytes, dict[str, Any] | None, Counts]:
        """A JSON Lines line redacted: (line, the redacted record or None when unchanged,
        counts). A line no gate opens for is returned as it is, without parsing it."""
        if not self.may_hold(line):
            return line, None, _NO_COUNTS
        record = orjson.loads(line)
        if not isinstance(record, dict):
            return line, None, _NO_COUNTS
        redacted, counts = self.record(record)
        if redacted is record:
            return line, None, counts
        return dumps_line(redacted), redacted, counts

    def may_hold(self, data: bytes) -> bool:
        """Whether JSON text could hold anything to redact (False: it cannot)."""
        return self.next_hit(data) >= 0

    def next_hit(self, data: bytes, pos: int = 0) -> int:
        """Where the first possible match in JSON Lines text at or after ``pos`` is (-1:
        none). A match in a trajectory record's fields that are never redacted (the head
        before ``evaluation``, the tail from ``agent_version`` to ``labels``: ids, names,
        the scenario, dates) does not count."""
        if not self.kinds or pos >= len(data):
            return -1
        if self._line_gate is None:
            return pos
        while (match := self._line_gate.search(data, pos)) is not None:
            hit = int(match.start())
            if _DATE.match(data, hit):
                # A date opens the phone gate, and no finding of any kind starts with one
                # (digits inside a date are never a phone or a card): read on after it.
                pos = hit + 10
                continue
            start = data.rfind(b"\n", 0, hit) + 1
            end = data.find(b"\n", hit)
            for a, b in _fixed_fields(data, start, len(data) if end < 0 else end):
                if a <= hit < b:
                    pos = b
                    break
            else:
                return hit
        return -1

    # places

    def _strings(self, value: Any, p: _Pass, values: Iterable[str] = ()) -> Any:
        """Every string inside a JSON value (keys kept), redacted."""
        if isinstance(value, str):
            if p.dry:
                p.texts.append(value)
                return value
            new, found = self.text(value, values)
            add_counts(p.counts, found)
            return new if found else value
        if isinstance(value, list):
            items = [self._strings(v, p, values) for v in value]
            return items if any(a is not b for a, b in zip(items, value, strict=True)) else value
        if isinstance(value, dict):
            pairs = {k: self._strings(v, p, values) for k, v in value.items()}
            return pairs if any(pairs[k] is not value[k] for k in value) else value
        return value

    def _structure(self, value: Any, p: _Pass) -> Any:
        """A JSON object or list of free text (metadata, tool input): its strings, with the
        secrets its keys name (``{"password": "..."}``) found across the whole of it."""
        if not isinstance(value, dict | list) or not self.kinds:
            return value
        text = json.dumps(value, ensure_ascii=False)
        if p.dry:  # the keys too: a key may name the secret its value is
            p.texts.append(text)
            return value
        if not self.gates.open(text):
            return value
        values = _secrets().keyword_values(text) if "secrets" in self.kinds else set()
        return self._strings(value, p, values)

    def _arguments(self, value: Any, p: _Pass) -> Any:
        """Tool-call arguments: a JSON string stays valid JSON."""
        if not isinstance(value, str):
            return self._structure(value, p)
        try:
            parsed = json.loads(value)
        except ValueError:
            parsed = None
        if not isinstance(parsed, dict | list):
            return self._strings(value, p)
        if p.dry:
            p.gather_json(value)
            return value
        new = self._structure(parsed, p)
        return value if new is parsed else json.dumps(new, ensure_ascii=False)

    def _content(self, content: Any, p: _Pass) -> Any:
        if isinstance(content, str):
            return self._strings(content, p)
        if not isinstance(content, list):
            return content
        parts = []
        for part in content:
            new = part
            if isinstance(part, dict):
                kind = part.get("type")
                if isinstance(part.get("text"), str):
                    new = {**part, "text": self._strings(part["text"], p)}
                elif kind == "tool_result" and "content" in part:
                    new = {**part, "content": self._content(part["content"], p)}
                elif kind == "tool_use" and "input" in part:
                    new = {**part, "input": self._structure(part["input"], p)}
                if all(new.get(k) is part.get(k) for k in part):
                    new = part
            parts.append(new)
        return parts if any(a is not b for a, b in zip(parts, content, strict=True)) else content

    def _message(self, message: Any, p: _Pass) -> Any:
        if not isinstance(message, dict):
            return message
        out = dict(message)
        if "content" in message:
            out["content"] = self._content(message["content"], p)
        calls = message.get("tool_calls")
        if isinstance(calls, list):
            out["tool_calls"] = _each(calls, lambda c: self._call(c, p))
        if isinstance(message.get("function_call"), dict):  # the legacy single call
            out["function_call"] = self._call({"function": message["function_call"]}, p)["function"]
        if isinstance(message.get("metadata"), dict | list):
            out["metadata"] = self._structure(message["metadata"], p)
        return out if any(out[k] is not message[k] for k in message) else message

    def _call(self, call: Any, p: _Pass) -> Any:
        if not isinstance(call, dict) or not isinstance(call.get("function"), dict):
            return call
        function = call["function"]
        if "arguments" not in function:
            return call
        arguments = self._arguments(function["arguments"], p)
        if arguments is function["arguments"]:
            return call
        return {**call, "function": {**function, "arguments": arguments}}

    def _messages(self, messages: Any, p: _Pass) -> Any:
        if isinstance(messages, RawJson):
            if p.dry:
                p.gather_json(messages.data.decode("utf-8", "surrogatepass"))
                return messages
            parsed = messages.value()
            new = self._messages(parsed, p)
            return messages if new is parsed else RawJson(orjson.dumps(new))
        if not isinstance(messages, list):
            return messages
        return _each(messages, lambda m: self._message(m, p))

    def _evaluation(self, evaluation: Any, p: _Pass) -> Any:
        if not isinstance(evaluation, dict):
            return evaluation
        out = dict(evaluation)
        if "results" in evaluation:
            out["results"] = self._results(evaluation["results"], p)
        if "report" in evaluation:
            out["report"] = self._report(evaluation["report"], p)
        return out if any(out[k] is not evaluation[k] for k in evaluation) else evaluation

    def _results(self, results: Any, p: _Pass) -> Any:
        return _each_field(results, "reasoning", lambda v: self._strings(v, p))

    def _report(self, report: Any, p: _Pass) -> Any:
        if not isinstance(report, dict) or not isinstance(report.get("classifications"), list):
            return report

        def classification(item: Any) -> Any:
            return _each_field(item, "assessments", lambda a: _each_field(
                a, "explanation", lambda v: self._strings(v, p)), whole=True)  # fmt: skip

        new = _each(report["classifications"], classification)
        return report if new is report["classifications"] else {**report, "classifications": new}

    def _labels(self, labels: Any, p: _Pass) -> Any:
        return _each_field(labels, "comment", lambda v: self._strings(v, p))

    def _metadata(self, metadata: Any, p: _Pass) -> Any:
        return self._structure(metadata, p)


_PLACES: dict[str, Callable[[Redactor, Any, _Pass], Any]] = {
    "evaluation": Redactor._evaluation,
    "labels": Redactor._labels,
    "metadata": Redactor._metadata,
    "report": Redactor._report,  # executions rows carry the report and results on their own
    "results": Redactor._results,
}


# The record layout's fields around the free text, in order (records.TrajectoryRecord): keys
# of our own encoding, which no text can hold (a quote in a string is escaped).
_HEAD_END = b',"evaluation":'
_TAIL_START = b',"agent_version":"'
_TAIL_END = b',"labels":['


def _fixed_fields(data: bytes, start: int, end: int) -> list[tuple[int, int]]:
    """Where the line ``data[start:end]`` holds a trajectory record's fields that are never
    redacted: from its start to ``evaluation`` (the first such key: an evaluator named so
    in ``evaluator_scores`` ends the region early, never late), and from the last
    ``agent_version`` key (only ``labels``, whose keys are fixed, comes after it) to
    ``labels`` or the end. Nothing for lines of another shape (a key ``evaluation`` inside a
    ``messages`` row's conversation is not the record's)."""
    regions = []
    head = data.find(_HEAD_END, start, end)
    if (
        head >= 0
        and data.startswith(b'{"trace_id":', start)
        and data.find(b'"messages":', start, head) < 0  # a row of another shape (messages)
    ):
        regions.append((start, head))
        tail = data.rfind(_TAIL_START, head, end)
        if tail >= 0:
            labels = data.find(_TAIL_END, tail, end)
            regions.append((tail, end if labels < 0 else labels))
    return regions


# --- gathering: the strings of the places above, without copying anything ------------------
# (The same places as Redactor._walk, walked lean: most records hold nothing to redact, and
# this walk is all they cost. A unit test holds the two to the same strings.)


def _gather(record: dict[str, Any], p: _Pass) -> None:
    texts = p.texts
    for key in _MESSAGE_KEYS:
        messages = record.get(key)
        if isinstance(messages, RawJson):
            p.gather_json(messages.data.decode("utf-8", "surrogatepass"))
        elif isinstance(messages, list):
            for message in messages:
                if isinstance(message, dict):
                    _gather_message(message, p)
    evaluation = record.get("evaluation")
    if isinstance(evaluation, dict):
        _gather_results(evaluation.get("results"), texts)
        _gather_report(evaluation.get("report"), texts)
    _gather_results(record.get("results"), texts)
    _gather_report(record.get("report"), texts)
    labels = record.get("labels")
    if isinstance(labels, list):
        texts += [x["comment"] for x in labels if isinstance(x, dict) and isinstance(
            x.get("comment"), str)]  # fmt: skip
    if isinstance(record.get("metadata"), dict | list):
        texts.append(json.dumps(record["metadata"], ensure_ascii=False))


def _gather_message(message: dict[str, Any], p: _Pass) -> None:
    texts = p.texts
    content = message.get("content")
    if isinstance(content, str):
        texts.append(content)
    elif isinstance(content, list):
        _gather_parts(content, p)
    calls = message.get("tool_calls")
    if isinstance(calls, list):
        for call in calls:
            if isinstance(call, dict):
                _gather_call(call.get("function"), p)
    _gather_call(message.get("function_call"), p)
    if isinstance(message.get("metadata"), dict | list):
        texts.append(json.dumps(message["metadata"], ensure_ascii=False))


def _gather_parts(parts: list[Any], p: _Pass) -> None:
    for part in parts:
        if not isinstance(part, dict):
            continue
        if isinstance(part.get("text"), str):
            p.texts.append(part["text"])
        elif part.get("type") == "tool_result":
            inner = part.get("content")
            if isinstance(inner, str):
                p.texts.append(inner)
            elif isinstance(inner, list):
                _gather_parts(inner, p)
        elif part.get("type") == "tool_use" and isinstance(part.get("input"), dict | list):
            p.texts.append(json.dumps(part["input"], ensure_ascii=False))


def _gather_call(function: Any, p: _Pass) -> None:
    if not isinstance(function, dict):
        return
    arguments = function.get("arguments")
    if isinstance(arguments, str):
        p.gather_json(arguments)
    elif isinstance(arguments, dict | list):
        p.texts.append(json.dumps(arguments, ensure_ascii=False))


def _gather_results(results: Any, texts: list[str]) -> None:
    if isinstance(results, list):
        texts += [x["reasoning"] for x in results if isinstance(x, dict) and isinstance(
            x.get("reasoning"), str)]  # fmt: skip


def _gather_report(report: Any, texts: list[str]) -> None:
    if not isinstance(report, dict) or not isinstance(report.get("classifications"), list):
        return
    for item in report["classifications"]:
        assessments = item.get("assessments") if isinstance(item, dict) else None
        if isinstance(assessments, list):
            texts += [a["explanation"] for a in assessments if isinstance(a, dict) and
                      isinstance(a.get("explanation"), str)]  # fmt: skip


_MESSAGE_KEYS = ("messages", "conversation", "prompt", "completion", "chosen", "rejected")


def _find_all(text: str, value: str) -> Iterator[int]:
    start = text.find(value)
    while start >= 0 and value:
        yield start
        start = text.find(value, start + len(value))


def _each(items: list[Any], fn: Callable[[Any], Any]) -> list[Any]:
    """``[fn(i) for i in items]``, or ``items`` itself when nothing changed."""
    new = [fn(i) for i in items]
    return new if any(a is not b for a, b in zip(new, items, strict=True)) else items


def _each_field(items: Any, key: str, fn: Callable[[Any], Any], *, whole: bool = False) -> Any:
    """For a list of objects (or, ``whole``, one object), ``key`` replaced by ``fn`` of it."""

    def one(item: Any) -> Any:
        if not isinstance(item, dict) or key not in item:
            return item
        new = fn(item[key])
        return item if new is item[key] else {**item, key: new}

    if whole:
        return one(items)
    return _each(items, one) if isinstance(items, list) else items


def warm_up(kinds: Sequence[str] = KINDS) -> None:
    """Import and build the detectors of ``kinds`` now, not on a first request."""
    if "secrets" in kinds:
        _secrets()
    if set(kinds) & set(PII_KINDS):
        _presidio()


@functools.lru_cache(maxsize=32)
def redactor(kinds: tuple[str, ...]) -> Redactor:
    """The redactor of some kinds (made once per process)."""
    return Redactor(kinds)
