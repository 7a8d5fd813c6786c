"""The ``secrets`` kind: a maintained rule set shipped as a package, the project's rules on
top, behind a gate derived from both (DESIGN.md section 10; docs/guides/redaction.md).

The base is kingfisher-secret-scanner (MongoDB's scanner: Betterleaks' and Google Veles'
rules, several hundred, with their entropy and stop-word filters, compiled with Vectorscan),
called in process on each string (:meth:`SecretsDetector.spans`): it reports the byte
offsets of the secret itself, never the key name or the rest of the line. Its findings kept
are the visible ones and those of the helper rules whose value is itself a secret (an AWS
secret access key without its key id). Base64 decoding is off: a finding is a match in the
text itself, which is what makes the gate below a proof. The project's own rules
(:mod:`rl_export.privacy.secret_rules`) add the formats the rule set lacks or reports only
beside a companion, assignments (``password: ...``) whose value alone goes, and the checks
that turn down words and numbers.

The gate: every rule, theirs and ours, needs one of the literals
:func:`~rl_export.privacy.literals.required_literals` derives from its pattern; the gate is
one RE2 automaton of all of them (:attr:`SecretsDetector.gate`). A rule that has no such
literals (a handful of the rule set's) is left out, its findings not used, so the gate is a
necessary condition for every finding. Strings the gate does not open for cost one RE2
search; a string it opens for costs one call into the scanner (about 10 µs and a few µs per
KB) and one RE2 set match.

Loading the rule set compiles its patterns: 3 to 10 s of CPU the first time on a machine,
about 0.5 s from kingfisher's disk cache after that (``KF_RULE_CACHE_DIR``, else the user's
cache directory), on first use (:func:`secrets_detector`): a command that does not redact
never loads it. The gates are derived from it once per process; the compiled rule set (about
35 MiB) is then let go, and loaded again only when a string opens its gate
(:attr:`SecretsDetector.scanner`; a server loads it at start: ``warm_up``).
"""

from __future__ import annotations

import contextlib
import ctypes
import functools
import re
import threading
from typing import Any

from rl_export.privacy.literals import gate_for, gate_pattern
from rl_export.privacy.secret_rules import (
    ASSIGNMENT,
    RULES,
    SECRET_WORDS,
    assigned,
    names_secret,
    placeholder,
    secret_value,
)
from rl_export.privacy.structural import layout_words

Range = tuple[int, int]

COMMON_WORDS = frozenset({
    "password", "passwords", "passed", "bypass", "token", "tokens", "secret", "secrets",
    "key", "keys", "monkey", "auth", "author", "credentials", "account", "application",
    "app", "happy", "path", "pattern", "message", "api", "box", "design", "signal",
})  # fmt: skip
"""Words of ordinary prose and code: a rule whose literals are found in one of them gets a
gate on JSON text that needs more of its pattern (the assignment after ``password``), so
that a line saying ``password reset`` is not parsed for it."""
_HELPER_SECRET = re.compile(r"secret|passphrase|security-token|(?:application|consumer)-key")
"""Helper rules (invisible: companions of another rule) whose value is itself a secret."""
_CAPTURE_SECRET = re.compile(r"(?i)password|secret|token|key")
"""Named captures that hold the secret of a finding that spans more (a connection URI)."""
_STRUCTURE = re.compile(r"=|;|://|@")
"""What makes the rest of a finding a connection string's or URL's structure, not secret."""
_SURROGATE = re.compile("[\ud800-\udfff]")
_TOKEN = frozenset("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789_-")
_B64 = frozenset("+/=")


class SecretsDetector:
    """The rule set and the project's rules, loaded once (:func:`secrets_detector`)."""

    def __init__(self, cache_dir: str | None = None) -> None:
        import kingfisher_sdk
        import re2

        self._cache_dir = cache_dir
        self._scanner: Any = None
        self._lock = threading.Lock()
        rules = kingfisher_sdk.Rules(cache_dir=cache_dir)
        theirs: list[tuple[str, str]] = []
        avoid = layout_words() | COMMON_WORDS
        self.kept: set[str] = set()  # the rule set's rules whose findings are used
        self.left_out: list[str] = []  # theirs without a gate (their findings are not used)
        for meta in rules.metadata():
            rule_id = meta["id"]
            if not meta["visible"] and not _HELPER_SECRET.search(rule_id):
                continue
            gate = gate_for(rules.detail(rule_id)["detection_regex"], avoid)
            if gate is None:
                self.left_out.append(rule_id)
                continue
            theirs.append(gate)
            self.kept.add(rule_id)
        self.rule_count = len(rules)
        # The compiled rule set is about 35 MiB: let it go until a string opens its gate
        # (an export of text without candidates never needs it), and give the memory back.
        del rules
        _release_memory()
        options = re2.Options()
        options.max_mem = 64 << 20
        self.own = [re2.compile(rule.pattern, options) for rule in RULES]
        ours: list[tuple[str, str]] = []
        for rule in RULES:
            gate = gate_for(rule.pattern, avoid)
            if gate is None:  # a rule of ours must have one: a unit test holds them to it
                raise ValueError(f"secret rule {rule.name!r} has no gate")
            ours.append(gate)
        gates = theirs + ours
        # Which rules a string opens the gate of: the rule set's (one entry, the scanner runs
        # them all) and each of ours (only those run).
        self.which = re2.Set.SearchSet(options)
        self.which.Add(gate_pattern([text for text, _ in theirs]))
        for text, _ in ours:
            self.which.Add(text)
        self.which.Compile()
        words = "|".join(sorted(SECRET_WORDS))
        self.gate_text = gate_pattern([text for text, _ in gates])
        """The gate on a string, as RE2 pattern text: every rule's."""
        # On JSON text (detectors.json_gate): every rule's, and the end of a key that names
        # a secret (``"db_pass":``, also escaped, in tool arguments that are JSON).
        key_end = f'(?i:{words})(?:"|\\\\")(?:[ \\t]|\\\\[rnt])*:'
        self.json_gate_text = gate_pattern([line for _, line in gates] + [key_end])
        self.gate = re2.compile(self.gate_text, options)

    @property
    def scanner(self) -> Any:
        """The rule set's scanner (loaded on first use, from kingfisher's disk cache)."""
        if self._scanner is None:
            import kingfisher_sdk

            with self._lock:
                if self._scanner is None:
                    rules = kingfisher_sdk.Rules(cache_dir=self._cache_dir)
                    self._scanner = kingfisher_sdk.Scanner(rules, base64=False)
        return self._scanner

    def named(self, key: str) -> bool:
        """Whether a key names a secret, so that its string value is one when it looks like
        one (``{"password": "..."}``): it ends in a secret word."""
        return names_secret(key)

    def spans(self, text: str, key: str | None = None) -> list[Range]:
        """Where the secrets of ``text`` are (character offsets, whole tokens, possibly
        overlapping); ``key``: the name the text is the value of, if any."""
        found: list[Range] = []
        if key is not None and self.named(key) and secret_value(text):
            stripped = text.strip()
            if not any(c.isspace() for c in stripped):  # one token, never a sentence
                start = text.index(stripped)
                found.append((start, start + len(stripped)))
        safe = _SURROGATE.sub("\ufffd", text) if not text.isascii() else text
        opened = self.which.Match(safe)
        if not opened:
            return found
        ours = self._ours(safe, opened)
        # A finding of theirs that holds one of ours and, beside it, only the structure of a
        # connection string or URL (``Endpoint=...;SharedAccessKey=...``) gives way to ours:
        # everything but the password is kept.
        for a, b in self._theirs(safe) if 0 in opened else ():
            inner = [(c, d) for c, d, _ in ours if a <= c and d <= b and (c, d) != (a, b)]
            rest = safe[a:b]
            for c, d in sorted(inner, reverse=True):
                rest = rest[: c - a] + rest[d - a :]
            if (not inner or not _STRUCTURE.search(rest)) and not placeholder(safe[a:b]):
                found.append(whole_token(text, (a, b)))
        found += [whole_token(text, (a, b), left=left) for a, b, left in ours]
        return found

    def _theirs(self, text: str) -> list[Range]:
        data = text.encode("utf-8")
        offsets = _Offsets(text, data)
        out: list[Range] = []
        for finding in self.scanner.scan(data):
            if finding.rule_id not in self.kept:
                continue
            location = finding.location
            start, end = location["start_offset"], location["end_offset"]
            narrowed = _captured(finding.captures, data, start, end)
            out += [(offsets.char(a), offsets.char(b)) for a, b in narrowed or [(start, end)]]
        return out

    def _ours(self, text: str, opened: list[int]) -> list[tuple[int, int, bool]]:
        out: list[tuple[int, int, bool]] = []
        for index in (i - 1 for i in opened if i):
            rule = RULES[index]
            for match in self.own[index].finditer(text):
                if rule.pattern is ASSIGNMENT:
                    picked = assigned(match.groups())
                    if picked is not None:
                        group, value = picked
                        start = match.start(group)
                        out.append((start, start + len(value), True))
                    continue
                group = 1 if match.groups() else 0
                value = match.group(group)
                if placeholder(value) or (rule.check is not None and not rule.check(value)):
                    continue
                out.append((*match.span(group), rule.left))
        return out


def _captured(captures: dict[str, str], data: bytes, start: int, end: int) -> list[tuple[int, int]]:
    """The byte ranges, inside a finding, of its captures that name a secret (a URI's
    password rather than the whole URI); none when it has no such capture."""
    out = []
    for name, value in captures.items():
        if not _CAPTURE_SECRET.search(name) or not value:
            continue
        raw = value.encode("utf-8")
        at = data.find(raw, start, end)
        if at >= 0:
            out.append((at, at + len(raw)))
    return out


def _release_memory() -> None:
    """Hand freed memory back to the system (glibc keeps it otherwise; nothing elsewhere)."""
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL("libc.so.6").malloc_trim(0)


class _Offsets:
    """UTF-8 byte offsets of ``data`` (``text`` encoded) as character offsets of ``text``."""

    def __init__(self, text: str, data: bytes) -> None:
        self.ascii = len(text) == len(data)
        self.data = data

    def char(self, offset: int) -> int:
        if self.ascii:
            return offset
        return len(self.data[:offset].decode("utf-8", "replace"))


def whole_token(text: str, span: Range, *, left: bool = True) -> Range:
    """A secret's span widened to the whole token it is part of (letters, digits, ``_`` and
    ``-`` either side; after it ``+``, ``/`` and ``=`` too when the secret holds one:
    base64): a pattern that stops early (24 characters of a longer key) must not leave a
    tail."""
    start, end = span
    after = _TOKEN | _B64 if any(c in _B64 for c in text[start:end]) else _TOKEN
    while left and start > 0 and text[start - 1] in _TOKEN:
        start -= 1
    while end < len(text) and text[end] in after:
        end += 1
    return start, end


@functools.cache
def secrets_detector() -> SecretsDetector:
    """The detector, loaded on first use, once per process."""
    return SecretsDetector()


def rule_counts() -> dict[str, Any]:
    """How many rules the detector runs: the rule set's (kept and left out) and ours."""
    detector = secrets_detector()
    return {
        "rule_set": detector.rule_count,
        "rule_set_used": len(detector.kept),
        "rule_set_without_gate": sorted(detector.left_out),
        "own": len(RULES),
    }
