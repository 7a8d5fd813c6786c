"""The literals every match of a regular expression holds: a gate derived from a rule set.

A detector's patterns are costly to run on every string; a *gate* is a cheap test that every
match needs, run first (DESIGN.md section 10: a fast path may skip only what it proves holds
nothing). :func:`required_literals` reads a pattern (Rust/RE2 syntax, as the maintained rule
sets write them) and gives a set of strings of which every match contains one, or None when it
cannot tell (then the rule has no gate, and its findings are not used: a rule that runs only
where its gate opens must have one).

How: the pattern is parsed with Python's own regular-expression parser (after turning the
few Rust spellings it lacks into ones it reads: POSIX classes, ``\\p{..}``, ``\\x{..}``,
``\\z``, inline flags) and each node is summarised bottom-up, as RE2's prefilter and trigram
indexes do: the exact strings it can match (while they are few), the prefixes and suffixes
every match of it starts or ends with, and the best set of literals some match of it must
hold. A concatenation joins exact runs; an alternation unites its branches' sets (a branch
without one leaves none); a repeat that may be absent, a class of more than eight characters,
``.`` and anything unknown hold nothing. Every step only forgets what it cannot keep, so the
answer is a necessary condition (a property test holds it on strings generated from the
patterns).

:func:`line_safe` cuts a literal to the longest run JSON writes as it is (no quote,
backslash or control character): a gate on a JSON line's bytes finds such a run exactly where
the decoded string has it (any other character could be a ``\\uXXXX`` escape: lines holding
one are parsed whatever the gate says).

Pure: no I/O.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Iterable
from re import _constants as sre  # type: ignore[attr-defined]  # the stdlib's own parser
from re import _parser as sre_parse  # type: ignore[attr-defined]
from typing import Any

Literals = frozenset[str]
Node = tuple[Any, Any]
"""A node of the standard library's parse tree: an opcode and its argument (untyped there)."""

_MAX_SET = 64  # exact alternatives kept for one node
_MAX_LEN = 32  # characters kept for one exact string
_SMALL_CLASS = 8  # a class of at most this many characters is as good as its characters


class _Info:
    """What is known of the matches of one node."""

    __slots__ = ("best", "exact", "prefix", "suffix")

    def __init__(
        self,
        exact: set[str] | None = None,
        best: set[str] | None = None,
        prefix: set[str] | None = None,
        suffix: set[str] | None = None,
    ) -> None:
        self.exact = exact  # every string a match can be (None: too many, or unknown)
        self.prefix = exact if exact is not None else prefix  # one of these starts each match
        self.suffix = exact if exact is not None else suffix  # one of these ends each match
        self.best = best  # every match holds one of these (None: no such set is known)

    def required(self) -> set[str] | None:
        if self.exact is not None and "" not in self.exact:
            return self.exact
        return self.best


_NOTHING = _Info()
_EMPTY = _Info({""})


def _score(found: set[str] | None) -> int:
    """How selective a set is: its shortest literal first, then fewer literals."""
    if not found:
        return -1
    return min(len(s) for s in found) * 100 - len(found)


def _better(a: set[str] | None, b: set[str] | None) -> set[str] | None:
    return a if _score(a) >= _score(b) else b


def _cat(a: set[str] | None, b: set[str] | None) -> set[str] | None:
    if a is None or b is None or len(a) * len(b) > _MAX_SET:
        return None
    joined = {x + y for x in a for y in b}
    return joined if max(map(len, joined)) <= _MAX_LEN else None


def _nonempty(found: set[str] | None) -> set[str] | None:
    return found if found is not None and "" not in found else None


def _sequence(items: list[Node]) -> _Info:
    exact: set[str] | None = {""}
    prefix: set[str] | None = None
    at_start = True
    best: set[str] | None = None
    for op, av in items:
        info = _node(op, av)
        if info.exact is not None:
            joined = _cat(exact, info.exact)
            if joined is not None:
                exact = joined
                continue
            best = _better(best, _nonempty(exact))  # too many: a run ends here
            if at_start:
                prefix, at_start = _nonempty(exact), False
            exact = info.exact
            continue
        # Not exact: the run so far followed by one of its prefixes is needed, and so is
        # whatever it needs itself; a new run starts with its suffixes.
        joined = _cat(exact, info.prefix) if info.prefix else None
        best = _better(_better(best, joined), _better(_nonempty(exact), info.required()))
        if at_start:
            prefix, at_start = joined if joined is not None else _nonempty(exact), False
        exact = info.suffix if info.suffix is not None else {""}
    if at_start:
        return _Info(exact)
    best = _better(best, _nonempty(exact))
    return _Info(None, best, prefix, _nonempty(exact))


def _union(sets: list[set[str] | None]) -> set[str] | None:
    found: set[str] = set()
    for one in sets:
        if one is None:
            return None
        found |= one
    return found if len(found) <= _MAX_SET else None


def _node(op: Any, av: Any) -> _Info:
    if op is sre.LITERAL:
        return _Info({chr(av)})  # a code point
    if op is sre.IN:
        chars: set[str] = set()
        for item_op, item in av:
            if item_op is sre.LITERAL:
                chars.add(chr(item))
            elif item_op is sre.RANGE and item[1] - item[0] < _SMALL_CLASS:
                chars.update(chr(c) for c in range(item[0], item[1] + 1))
            else:  # a negation, a category, a large range
                return _NOTHING
        return _Info(chars) if len(chars) <= _SMALL_CLASS else _NOTHING
    if op in (sre.AT, sre.ASSERT, sre.ASSERT_NOT):
        return _EMPTY  # zero width (what an assertion needs is ignored: weaker, still true)
    if op is sre.SUBPATTERN:
        return _sequence(list(av[-1]))
    if op is sre.BRANCH:
        branches = [_sequence(list(b)) for b in av[1]]
        exact = _union([b.exact for b in branches])
        if exact is not None:
            return _Info(exact)
        return _Info(
            None,
            _union([b.required() for b in branches]),
            _union([b.prefix for b in branches]),
            _union([b.suffix for b in branches]),
        )
    if op in (sre.MAX_REPEAT, sre.MIN_REPEAT, getattr(sre, "POSSESSIVE_REPEAT", None)):
        low, high, sub = av
        inner = _sequence(list(sub))
        if low == 0:
            return _NOTHING
        if inner.exact is not None:
            repeated: set[str] = {""}
            done = 0
            while done < low:  # the first ``low`` repeats are there
                longer = _cat(repeated, inner.exact)
                if longer is None:
                    break
                repeated, done = longer, done + 1
            if done == low == high:
                return _Info(repeated)  # exactly these
            if done:
                return _Info(None, _nonempty(repeated), repeated, _nonempty(inner.exact))
        return _Info(None, inner.required(), inner.prefix, inner.suffix)
    return _NOTHING  # ., categories, back references, anything else


# --- Rust and RE2 spellings Python's parser does not read ------------------------------------

_FLAGS = re.compile(r"\(\?([a-zA-Z]*)(?:-([a-zA-Z]*))?(\)|:)")


def _python_pattern(pattern: str) -> tuple[str, int, bool] | None:
    """``pattern`` in Python's syntax, its global flags, and whether it is case-insensitive
    anywhere; None when it cannot be read safely. Only rewrites that keep every match a
    match: a flag set anywhere counts everywhere (``(?i)`` in the middle makes the whole
    case-insensitive), a Unicode or POSIX class becomes ``\\w`` (a class, whatever it was)."""
    if "(?x" in pattern and not pattern.startswith("(?x)"):
        return None  # verbose mode in part: its spaces would read as literals
    icase = False
    verbose = pattern.startswith("(?x)")

    def flags(match: re.Match[str]) -> str:
        nonlocal icase
        if "i" in match.group(1):
            icase = True
        return "(?:" if match.group(3) == ":" else ""

    text = _FLAGS.sub(flags, pattern)
    text = re.sub(r"\\[pP]\{[^}]*\}|\\[pP][A-Za-z]|\[:\^?[a-z]+:\]", r"\\w", text)
    text = re.sub(r"\\x\{([0-9A-Fa-f]{1,6})\}", lambda m: f"\\U{int(m.group(1), 16):08x}", text)
    text = text.replace("\\z", "\\Z").replace("(?<", "(?P<").replace("(?P<=", "(?<=")
    text = text.replace("(?P<!", "(?<!")
    return text, re.VERBOSE if verbose else 0, icase


def required_literals(pattern: str) -> tuple[Literals, bool] | None:
    """A set of strings one of which every match of ``pattern`` contains, and whether they
    are to be found case-insensitively; None when no such set is known."""
    parsed = _parse(pattern)
    if parsed is None:
        return None
    found = _sequence(parsed[0]).required()
    if not found:
        return None
    return frozenset(found), parsed[1]


_UNSAFE = re.compile(r'["\\\x00-\x1f]')


def line_safe(literal: str) -> str:
    """The longest run of ``literal`` that a JSON text writes unescaped (no quote, backslash
    or control character)."""
    return max(_UNSAFE.split(literal), key=len)


def _usable(literals: frozenset[str]) -> bool:
    """Whether literals are selective enough for a gate: each at least three characters
    long, or two with one that is no letter, digit or common punctuation (``Q~``)."""
    return all(
        len(s) >= 3 or (len(s) == 2 and any(not (c.isalnum() or c in " ._-") for c in s))
        for s in literals
    )


def literal_gate(pattern: str) -> str | None:
    """An RE2 pattern of the literals one of which every match of ``pattern`` holds (each
    cut by :func:`line_safe`); None when there are none worth a gate."""
    found = required_literals(pattern)
    if found is None:
        return None
    literals = frozenset(line_safe(s) for s in found[0])
    if not _usable(literals):
        return None
    text = "|".join(sorted(re2_escape(s) for s in literals))
    return f"(?i:{text})" if found[1] else text


_UNSAFE_CODES = frozenset([*range(0x20), ord('"'), ord("\\")])
_GATE_REPEAT = 8  # a gate's repeats count this many at most


def _safe_code(code: int) -> bool:
    return code not in _UNSAFE_CODES


def _re2_class(items: list[Node]) -> str | None:
    parts = []
    for op, av in items:
        if op is sre.LITERAL and _safe_code(av):
            parts.append(re2_escape(chr(av), in_class=True))
        elif op is sre.RANGE and not any(lo_hi_overlap(av, c) for c in _UNSAFE_CODES):
            low, high = av
            parts.append(
                f"{re2_escape(chr(low), in_class=True)}-{re2_escape(chr(high), in_class=True)}"
            )
        elif op is sre.CATEGORY and av is sre.CATEGORY_DIGIT:
            parts.append("\\p{Nd}")  # Rust's \\d: every decimal digit
        else:
            return None  # a negation, a class of spaces or words, a quote or a backslash
    return "[" + "".join(parts) + "]"


def lo_hi_overlap(pair: Any, code: int) -> bool:
    low, high = pair
    return bool(low <= code <= high)


def _re2_sequence(items: list[Node], wild: str | None) -> str | None:
    out: list[str] = []
    for op, av in items:
        part = _re2_node(op, av, wild)
        if part is None:
            return None
        if not (part == wild and out and out[-1] == wild):  # one wildcard for a run of them
            out.append(part)
    return "".join(out)


def _re2_node(op: Any, av: Any, wild: str | None) -> str | None:
    """A node as RE2 text matching the JSON text of what it matches (and maybe more): a
    character JSON writes escaped, or a node that may match one, becomes ``wild`` (None:
    no such node may be there)."""
    if op is sre.LITERAL:
        return re2_escape(chr(av)) if _safe_code(av) else wild
    if op is sre.IN:
        found = _re2_class(list(av))
        return wild if found is None else found
    if op in (sre.AT, sre.ASSERT, sre.ASSERT_NOT):
        return ""  # an assertion left out: more matches, never fewer
    if op is sre.SUBPATTERN:
        inner = _re2_sequence(list(av[-1]), wild)
        return None if inner is None else wild if inner == wild else f"(?:{inner})"
    if op is sre.BRANCH:
        branches = []
        for branch in av[1]:
            text = _re2_sequence(list(branch), wild)
            if text is None:
                return None
            branches.append(text)
        if wild is not None and wild in branches:
            return wild
        return "(?:" + "|".join(branches) + ")"
    if op in (sre.MAX_REPEAT, sre.MIN_REPEAT, getattr(sre, "POSSESSIVE_REPEAT", None)):
        low, _, sub = av
        if low == 0 and wild is not None:
            return wild  # may be absent: any run of string text holds what it matches
        inner = _re2_sequence(list(sub), wild)
        if inner is None or inner == wild:
            return inner
        # At least a few, no upper bound: more matches than the rule's, and a small
        # automaton (counted repeats of dozens multiply its states).
        return f"(?:{inner}){{{min(low, _GATE_REPEAT)},}}"
    return wild  # ., a category outside a class, a back reference


@functools.lru_cache(maxsize=2048)
def _parse(pattern: str) -> tuple[list[Node], bool] | None:
    """``pattern`` parsed (each is parsed once: three gates read it), and whether it folds
    case; None when it cannot be read safely."""
    parsed = _python_pattern(pattern)
    if parsed is None:
        return None
    text, flags, icase = parsed
    try:
        return list(sre_parse.parse(text, flags)), icase
    except (re.error, OverflowError, RecursionError, ValueError):
        return None


def regex_gate(pattern: str) -> str | None:
    """``pattern`` itself as an RE2 gate, when every character it can match is one a JSON
    text writes unescaped (a vendor prefix and a run of letters and digits): its matches,
    and maybe more (assertions are left out, repeats counted at most a few times, ``\\d``
    any decimal digit as in Rust); None otherwise."""
    parsed = _parse(pattern)
    if parsed is None:
        return None
    body = _re2_sequence(parsed[0], None)
    if not body:
        return None
    return f"(?i:{body})" if parsed[1] else body


IN_STRING = r'(?:[^"\\\n]|\\.)*'
"""RE2: any run of a JSON string's text (escapes whole, never past its closing quote)."""


def json_gate(pattern: str) -> str | None:
    """An RE2 gate for the JSON text of a string where ``pattern`` matches: the pattern with
    every part that may match a character JSON escapes (a quote, a backslash, a control
    character: ``\\s``, ``[^...]``, ``.``) made any run of string text
    (:data:`IN_STRING`), the rest as in :func:`regex_gate`, and cut after its first such
    run that follows something else (any start of a match is a necessary condition too,
    and a shorter one is a smaller automaton). It finds every JSON string that holds a
    match, never past the string's end; None when nothing of the pattern is left but such
    runs."""
    parsed = _parse(pattern)
    if parsed is None:
        return None
    parts: list[str] = []
    for op, av in parsed[0]:
        part = _re2_node(op, av, IN_STRING)
        if part is None:
            return None
        if part == IN_STRING:
            if not parts or parts[-1] == IN_STRING:
                continue  # a leading run (any start will do), or one run with the last
            if IN_STRING in parts:
                break  # a second run after something else: what came before is enough
        parts.append(part)
    while parts and parts[-1] == IN_STRING:
        parts.pop()
    body = "".join(parts)
    if not body:
        return None
    return f"(?i:{body})" if parsed[1] else body


def gate_for(pattern: str, avoid: Iterable[str] = ()) -> tuple[str, str] | None:
    """A rule's two gates, as RE2 pattern text: on a string, its literals
    (:func:`literal_gate`), else its own pattern when it can serve (:func:`regex_gate`); on
    JSON text, its literals too, but when they are found in one of the words to ``avoid``
    (the JSON layout's own keys, ``false``, common words: every line holds them): then its
    own pattern, or :func:`json_gate`, which need more of the rule. None when it has no gate
    worth having (the rule must then not be used)."""
    whole = regex_gate(pattern)  # its characters are all written as they are in JSON
    literals = literal_gate(pattern)
    # Literals first: an automaton of hundreds of literals stays small, and RE2 searches at
    # its full speed; one of hundreds of patterns with classes and counted repeats grows
    # past its memory on hex-heavy text (logs, hashes) and searches ten times slower.
    text = literals or whole
    if literals is not None and not any(re.search(literals, word) for word in avoid):
        line: str | None = literals
    else:
        line = whole or json_gate(pattern)
    if text is None or line is None:
        return None
    return text, line


_RE2_SPECIAL = frozenset("\\.^$|?*+()[]{}-#&~")


def re2_escape(literal: str, *, in_class: bool = False) -> str:
    """``literal`` as RE2 pattern text (special characters escaped, a space as ``\\x20``)."""
    out = []
    for c in literal:
        if c == " ":
            out.append("\\x20")
        elif c in _RE2_SPECIAL or (in_class and c in "^-]"):
            out.append("\\" + c)
        else:
            out.append(c)
    return "".join(out)


def gate_pattern(gates: list[str]) -> str:
    """One RE2 pattern that matches where any of the gates does."""
    return "|".join(f"(?:{g})" for g in sorted(set(gates)))
