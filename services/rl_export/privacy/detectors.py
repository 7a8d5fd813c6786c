"""The detectors of redaction (:mod:`rl_export.privacy.redact`), one per kind, behind gates.

Each kind has a *gate*, a cheap necessary condition (an RE2 pattern: linear time), and a
detector that runs only on windows of text around its gate's matches:

- ``secrets``: bc-detect-secrets' plugins, called on strings (never their network
  verification), its keyword detector kept to values whose entropy says they are no word, and
  the recognizers of :data:`EXTRA_SECRETS` for key formats the fork has no plugin for;
- ``email``, ``phone``, ``credit_card``, ``iban``, ``ip``: Presidio's predefined pattern
  recognizers, constructed directly (no ``AnalyzerEngine``: no spaCy pipeline, no model).

The libraries are imported on first use (:func:`secrets_detector`, :func:`pii_detector`).
A detector gives spans ``(start, end, kind)``; the redactor replaces them.
"""

from __future__ import annotations

import base64
import functools
import math
import re
import string
from collections import Counter
from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import Any

KINDS: tuple[str, ...] = ("secrets", "email", "phone", "credit_card", "iban", "ip")
"""The kinds of docs/guides/exports.md's redaction: ``secrets``, ``email``, ``phone``,
``credit_card``, ``iban``, ``ip`` (the metrics' closed set of ``kind`` label values)."""


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
        r"[MNO][a-zA-Z0-9_-]{23,25}\.|sk-|AIza|gl[a-z]{1,5}-|hf_|"
        r"[rs]k_test_|whsec_|npm_|pypi-|[0-9]:AA|shp[a-z]{2}_|dckr_|do[opr]_v1_|dapi|sntry|"
        r"glsa_|glc_|PMAK-|lin_api_|hv[sb]\.|dp\.|NR[A-Z]{2}-|ATATT3|AGE-SECRET|sbp_|"
        r"fig[dhu]_|gsk_|r8_|pplx-|xai-|EAAA|sq0atp-|LTAI|ntn_|pcsk_|lsv2_|HRKU-|(?i:basic)"
    ),
    "email": "@",
    # At least 7 digits in a run of digits and phone punctuation (python-phonenumbers'
    # VALID_PUNCTUATION; PhoneRecognizer's results are kept only in that shape: _phone_ok),
    # not followed by a Latin letter: phonenumbers' matcher refuses a number a letter
    # follows (a unit test holds Presidio to it), and so an ISO datetime's date, which a
    # 'T' follows, does not open the gate (a record's times cost a search each otherwise).
    # An 'x' may follow (it starts an extension).
    "phone": r"\p{Nd}(?:[ \t\-x\x{2010}-\x{2015}\x{2212}\x{30FC}\x{FF0D}-\x{FF0F}\x{00A0}"
    r"\x{00AD}\x{200B}\x{2060}\x{3000}()\x{FF08}\x{FF09}\x{FF3B}\x{FF3D}.\[\]/~\x{2053}"
    r"\x{223C}\x{FF5E}+]{0,4}\p{Nd}){6,}(?:[^A-WYZa-wyz\p{Nd}]|$)",
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


def byte_search(pattern: Any) -> Callable[[bytes, int], int]:
    """``search(data, pos)``: where a compiled RE2 pattern first matches bytes at or after
    ``pos`` (-1: nowhere). google-re2's ``search`` builds a generator and a match object per
    call (about 4 µs, half of what a ``--redact all`` export spent in the gates); the
    compiled program's own ``Match`` is called directly when the installed version has it,
    else ``search`` (the answer is the same: a unit test holds them to it)."""
    import re2

    program = getattr(pattern, "_regexp", None)
    anchor = getattr(getattr(re2, "_Anchor", None), "UNANCHORED", None)
    if program is None or anchor is None or not hasattr(program, "Match"):
        return lambda data, pos: -1 if (m := pattern.search(data, pos)) is None else m.start()
    match = program.Match

    def search(data: bytes, pos: int) -> int:
        if pos > len(data):
            return -1
        start: int = match(anchor, data, pos, len(data))[0][0]
        return start

    return search


# --- detectors ------------------------------------------------------------------------------

Span = tuple[int, int, str]  # start, end, kind

EXTRA_SECRETS: dict[str, str] = {
    # Formats bc-detect-secrets 1.5 has no plugin for (its GitHub plugin knows the classic
    # gh*_ tokens only; its Stripe plugin takes 24 characters of longer keys), written after
    # the vendors' documented prefixes as gitleaks' rule set has them. A group, where there
    # is one, is the credential; every span is then widened to its whole token
    # (:func:`whole_token`), so no tail is ever left.
    "OpenAI or Anthropic API key": r"\bsk-(?:proj-|ant-(?:api03-)?|svcacct-|admin-)?"
    r"[A-Za-z0-9_-]{20,}",
    "Google API key": r"\bAIza[0-9A-Za-z_-]{35}",
    "GitLab token": r"\bgl(?:pat|rt|ptt|dt|ft|soat|oas|cbt|imt|agent)-[0-9A-Za-z_-]{20,}",
    "Hugging Face token": r"\bhf_[A-Za-z0-9]{30,}",
    "GitHub fine-grained token": r"\bgithub_pat_[A-Za-z0-9_]{22,}",
    "Bearer token": r"(?i:\bbearer\s+)([A-Za-z0-9._~+/-]{20,}=*)",
    "Stripe key": r"\b(?:sk|rk)_(?:live|test)_[0-9A-Za-z]{20,}",
    "Stripe webhook secret": r"\bwhsec_[0-9A-Za-z]{24,}",
    "npm token": r"\bnpm_[A-Za-z0-9]{36}",
    "PyPI token": r"\bpypi-AgEIcHlwaS5vcmc[A-Za-z0-9_-]{50,}",
    "Discord webhook URL": r"https://(?:(?:ptb|canary)\.)?discord(?:app)?\.com/api/webhooks/"
    r"[0-9]{17,20}/[A-Za-z0-9_-]{60,68}",
    "Telegram bot token": r"\b[0-9]{8,10}:AA[0-9A-Za-z_-]{33}",
    "Shopify token": r"\bshp(?:at|ss|ca|pa)_[a-fA-F0-9]{32}",
    "Docker Hub token": r"\bdckr_pat_[A-Za-z0-9_-]{27,}",
    "DigitalOcean token": r"\bdo[opr]_v1_[a-f0-9]{64}",
    "Databricks token": r"\bdapi[a-f0-9]{32}",
    "Sentry token": r"\bsntry[us]_[A-Za-z0-9_=+/-]{40,}",
    "Grafana token": r"\b(?:glsa_[A-Za-z0-9]{32}_[A-Fa-f0-9]{8}|glc_[A-Za-z0-9+/]{32,}={0,2})",
    "Postman API key": r"\bPMAK-[a-f0-9]{24}-[a-f0-9]{34}",
    "Linear API key": r"\blin_api_[A-Za-z0-9]{40}",
    "HashiCorp Vault token": r"\bhv[sb]\.[A-Za-z0-9_-]{24,}",
    "Doppler token": r"\bdp\.(?:pt|st|sa|ct|scim|audit)\.[A-Za-z0-9]{40,44}",
    "New Relic key": r"\bNR(?:AK|II|JS|RA)-[A-Za-z0-9]{27}",
    "Atlassian API token": r"\bATATT3[A-Za-z0-9_=-]{150,}",
    "age secret key": r"\bAGE-SECRET-KEY-1[QPZRY9X8GF2TVDW0S3JN54KHCE6MUA7L]{58}",
    "Supabase token": r"\bsbp_[a-f0-9]{40}",
    "Figma token": r"\bfig[dhu]_[A-Za-z0-9_-]{40,}",
    "Groq key": r"\bgsk_[A-Za-z0-9]{52}",
    "Replicate token": r"\br8_[A-Za-z0-9]{37}",
    "Perplexity key": r"\bpplx-[A-Za-z0-9]{48}",
    "xAI key": r"\bxai-[A-Za-z0-9]{80}",
    "Square token": r"\b(?:EAAA[A-Za-z0-9_-]{60}|sq0atp-[0-9A-Za-z_-]{22})",
    "Alibaba access key id": r"\bLTAI[A-Za-z0-9]{20}",
    "Notion token": r"\bntn_[A-Za-z0-9]{40,}",
    "Pinecone key": r"\bpcsk_[A-Za-z0-9_]{40,}",
    "LangSmith key": r"\blsv2_(?:pt|sk)_[a-f0-9]{32}_[a-f0-9]{10}",
    "Heroku token": r"\bHRKU-[A-Za-z0-9_-]{36,}",
    "Azure storage account key": r"AccountKey=([A-Za-z0-9+/]{86}==)",
    "Credentials in a URL": r"://([^\s:/?#@\[\]\"'<>]*:[^\s/?#@\"'<>]+)@",
}
# ``Authorization: Basic <base64>``: kept only when the value decodes to ``user:password``
# (so 'basic understanding' stays).
BASIC_AUTH = r"(?i:\bbasic\s+)([A-Za-z0-9+/]{8,}={0,2})"
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
        # The patterns without a group are one alternation (one pass over a window, not
        # forty), in RE2 (a DFA: Python's re would try each alternative at every position,
        # which doubled the cost of a window); those whose group is the credential run on
        # their own.
        import re2

        plain = [p for p in EXTRA_SECRETS.values() if re.compile(p).groups == 0]
        grouped = [p for p in EXTRA_SECRETS.values() if re.compile(p).groups > 0]
        self.prefixed = re2.compile("|".join(f"(?:{p})" for p in plain))
        self.extra = [re.compile(p) for p in grouped]
        self.basic = re.compile(BASIC_AUTH)
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
            spans += [(offset + m.start(), offset + m.end(), "secrets")
                      for m in self.prefixed.finditer(piece)]  # fmt: skip
            for pattern in self.extra:
                for match in pattern.finditer(piece):
                    group = match.lastindex or 0
                    spans.append(
                        (offset + match.start(group), offset + match.end(group), "secrets")
                    )
            spans += [(offset + a, offset + b, "secrets") for a, b in self._basic(piece)]
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
            spans += [(i, i + len(value), "secrets") for i in find_all(text, value)]
        return [whole_token(text, span) for span in spans]

    def _basic(self, piece: str) -> Iterator[tuple[int, int]]:
        """``Basic <base64>`` whose value decodes to ``user:password``."""
        for match in self.basic.finditer(piece):
            try:
                decoded = base64.b64decode(match.group(1), validate=True).decode()
            except (ValueError, UnicodeDecodeError):
                continue
            if ":" in decoded and decoded.isprintable():
                yield match.start(1), match.end(1)


_TOKEN = frozenset(string.ascii_letters + string.digits + "_-")


def whole_token(text: str, span: Span) -> Span:
    """A secret's span widened to the whole token it is part of (letters, digits, ``_`` and
    ``-`` either side): a pattern that stops early (24 characters of a longer Stripe key)
    must not leave a tail."""
    start, end, kind = span
    while start > 0 and text[start - 1] in _TOKEN:
        start -= 1
    while end < len(text) and text[end] in _TOKEN:
        end += 1
    return start, end, kind


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


DIGIT_KINDS = frozenset({"phone", "credit_card"})
DATE = re.compile(rb"\d{4}-\d\d-\d\d")
DATETIME = re.compile(
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
MARGINS = {"secrets": 320, "email": 100, "phone": 24, "credit_card": 32, "iban": 48, "ip": 48}


def widen(text: str, windows: Iterable[tuple[int, int]], margin: int = 24) -> list[tuple[int, int]]:
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
def secrets_detector() -> _Secrets:
    return _Secrets()


@functools.cache
def pii_detector() -> _Presidio:
    return _Presidio()


def find_all(text: str, value: str) -> Iterator[int]:
    start = text.find(value)
    while start >= 0 and value:
        yield start
        start = text.find(value, start + len(value))
