"""The project's own rules of the ``secrets`` kind, on top of the maintained rule set
(:mod:`rl_export.privacy.secrets`): formats it lacks or reports only beside a companion, and
assignments (``password: ...``, ``"api_key": "..."``) whose value alone is replaced.

Each rule is an RE2 pattern written here after the vendors' documented shapes. Its first
group, when it has one, is the credential (else the whole match), and a ``check`` may turn a
match down (a placeholder, a word). Every span is then widened to the whole token it is part
of (:func:`rl_export.privacy.secrets.whole_token`): no tail is ever left.

Assignments: :data:`ASSIGNMENT` finds ``NAME = VALUE`` (also ``:``, ``:=``, ``=>``, quoted
or not) where NAME ends in a secret word (:func:`names_secret`); VALUE is one token (a quoted
value may hold spaces), never the rest of a sentence, and it stops at ``;``, ``&``, ``,`` and
brackets, so a connection string keeps everything but its password. :func:`secret_value`
turns down what is no secret: an English word or an identifier made of words
(``os.environ``, ``getToken``), a number, a version, a date, a path, a placeholder or template
(``<token>``, ``${TOKEN}``, ``{{ secrets.X }}``, ``********``), a short value.

Pure: no I/O.
"""

from __future__ import annotations

import base64
import binascii
import math
import re
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass

Check = Callable[[str], bool]


@dataclass(frozen=True, slots=True)
class Rule:
    """One pattern: its name, its RE2 text, what a match must also pass (besides being no
    placeholder), and whether its span may grow to the left (a Telegram token follows
    ``bot`` in the Bot API's URLs: the word is not the token's)."""

    name: str
    pattern: str
    check: Check | None = None
    left: bool = True


# --- values ---------------------------------------------------------------------------------

SECRET_WORDS = frozenset(
    {
        "password",
        "passwd",
        "passphrase",
        "pwd",
        "pass",
        "secret",
        "token",
        "key",
        "apikey",
        "credential",
        "credentials",
        "auth",
        "pat",
        "sig",
    }
)
"""The last word of a name that names a secret (``DB_PASSWORD``, ``apiKey``, ``GH_PAT``)."""
_LONG_WORDS = tuple(w for w in SECRET_WORDS if len(w) >= 5)
_LAST_LETTERS = re.compile(r"[A-Za-z]+\Z")
_CAMEL = re.compile(r"[A-Z]?[a-z]+|[A-Z]+(?![a-z])")


def names_secret(name: str) -> bool:
    """Whether a key or variable name names a secret: it ends in one of
    :data:`SECRET_WORDS`, a word of its own (split on ``_``, ``-``, ``.`` and camelCase):
    ``apiKey``, ``OPENAI_API_KEY``, ``db_pass``, ``PGPASSWORD`` and ``pwd`` do;
    ``max_tokens``, ``token_limit``, ``passed`` and ``monkey`` do not."""
    letters = _LAST_LETTERS.search(name)
    if letters is None:
        return False
    words = _CAMEL.findall(letters.group())
    if not words:
        return False
    last = words[-1].lower()
    # A long secret word may end a word of its own (PGPASSWORD, authtoken); a short one
    # must be one (a monkey is no key, bypass no pass).
    return last in SECRET_WORDS or any(last.endswith(w) for w in _LONG_WORDS)


_NUMBER = re.compile(r"[+-]?(?:[0-9][0-9_,:]*)?(?:\.[0-9]+)*(?:[eE][+-]?[0-9]+)?%?")
_VERSION = re.compile(r"[vV]?[0-9]+(?:\.[0-9]+)+(?:[-+.][0-9A-Za-z.]+)?")
_DATE = re.compile(r"[0-9]{4}-[0-9]{2}-[0-9]{2}(?:[T ][0-9:.]+)?(?:Z|[+-][0-9:]+)?")
_WORD_PIECES = re.compile(r"[A-Z]?[a-z]+|[A-Z]+(?![a-z])")
_TEMPLATES = ("${", "{{", "{%", "<", "%(", "$(", "[REDACTED")
_PLACEHOLDER_WORDS = frozenset(
    {
        "password",
        "passwd",
        "secret",
        "token",
        "changeme",
        "example",
        "none",
        "null",
        "nil",
        "undefined",
        "true",
        "false",
        "redacted",
        "hidden",
        "masked",
        "dummy",
        "placeholder",
    }
)
_MIN_LENGTH = 6
_MIN_ENTROPY = 2.4  # bits per character: 'hunter22' is 2.5, 'aaaa1111' 1.0


def entropy(value: str) -> float:
    """Shannon entropy of ``value``, in bits per character."""
    n = len(value)
    return -sum(c / n * math.log2(c / n) for c in Counter(value).values()) if n else 0.0


def placeholder(value: str) -> bool:
    """A template, a mask or a stand-in: ``${TOKEN}``, ``<your-key>``, ``********``,
    ``xxxxxxxx``, ``sk-xxxx...``, ``$API_KEY``, ``changeme``."""
    text = value.strip()
    low = text.lower()
    if not text or text.startswith(_TEMPLATES) or text[0] == "$" or low in _PLACEHOLDER_WORDS:
        return True
    body = re.sub(r"^[a-z]{2,8}[-_]", "", low)  # a vendor prefix: sk-, ghp_, ...
    return (
        "xxxx" in low
        or "****" in low
        or "...." in low
        or "your" in low
        or len(set(body.replace("-", "").replace("_", ""))) <= 2
    )


def word_like(value: str) -> bool:
    """Made of words: letters only, split by ``_ . - /``, spaces or camelCase into pieces of
    two letters or more (``keep``, ``os.environ``, ``getToken``, ``MyPassword``)."""
    pieces = re.split(r"[_.\-/ ]+", value.strip())
    for piece in pieces:
        if not piece:
            continue
        if not piece.isalpha():
            return False
        words = _WORD_PIECES.findall(piece)
        if "".join(words) != piece or any(len(w) < 2 for w in words):
            return False
    return True


def secret_value(value: str, *, quoted: bool = False) -> bool:
    """Whether a value assigned to a secret's name is a secret (DESIGN.md section 10: an
    English word or a number is not; nor a version, date, path, placeholder or, when it is
    not ``quoted``, code)."""
    text = value.strip()
    if len(text) < _MIN_LENGTH or placeholder(text) or word_like(text):
        return False
    if _NUMBER.fullmatch(text) or _VERSION.fullmatch(text) or _DATE.fullmatch(text):
        return False
    if text.startswith(("/", "./", "../", "~/", "http://", "https://", "file:")):
        return False  # a path or a URL (its credentials have their own rule)
    if not quoted and re.search(r"[()\[\]{}]", text):
        return False  # code: a call, an index
    if re.fullmatch(r"[A-Za-z_]\w*(?:\.\w+)+", text):
        return False  # an attribute
    return entropy(text) >= _MIN_ENTROPY


def _user_password(value: str) -> bool:
    """``user:password`` (a URL's credentials) whose password is no placeholder."""
    password = value.rpartition(":")[2]
    return bool(password) and not placeholder(password)


def _basic(value: str) -> bool:
    """An ``Authorization: Basic`` value that decodes to ``user:password``."""
    try:
        decoded = base64.b64decode(value, validate=True).decode()
    except (ValueError, binascii.Error, UnicodeDecodeError):
        return False
    return ":" in decoded and decoded.isprintable()


# --- assignments ----------------------------------------------------------------------------

_NAME = (
    r"([A-Za-z0-9_.-]*?)((?i:password|passwd|passphrase|pwd|pass|secret|token|key|credentials|"
    r"credential|auth|_pat|-pat|sig))"
)
_QUOTED = r"(?:\\?\"([^\"\\\n]+)\\?\"|'([^'\n]+)'|`([^`\n]+)`)"
# A bare value ends at white space, a quote or a bracket; after ``=`` (a URL's query, a
# connection string: ``password=...&ssl=true``, ``Password=...;Encrypt=True``) also at ``&``,
# ``;`` and ``,``; after ``:`` (YAML, prose) those may be in it.
_BARE_EQUALS = r"([^\s\"'`,;&<>(){}\[\]|\\]+)"
_BARE_COLON = r"([^\s\"'`<>(){}\[\]|\\]+)"
ASSIGNMENT = (
    rf"(?:^|[^A-Za-z0-9_.-]){_NAME}\\?[\"']?[ \t]{{0,3}}"
    rf"(?:(?:=>|:)[ \t]{{0,3}}(?:{_QUOTED}|{_BARE_COLON})"
    rf"|(?::=|=)[ \t]{{0,3}}(?:{_QUOTED}|{_BARE_EQUALS}))"
)
"""``NAME = VALUE``: groups 1 and 2 the name (the secret word last), then the value: after
``:`` or ``=>`` groups 3 to 5 quoted three ways or 6 bare; after ``=`` or ``:=`` groups 7 to
9 quoted or 10 bare."""


# --- tokens and key blocks ------------------------------------------------------------------

_B64URL = "A-Za-z0-9_-"
RULES: tuple[Rule, ...] = (
    # Cloud
    Rule("AWS access key id", r"\b(?:AKIA|ASIA|ABIA|ACCA)[A-Z0-9]{16}\b"),
    Rule("Google API key", r"\bAIza[0-9A-Za-z_-]{35}"),
    Rule("Google OAuth client secret", r"\bGOCSPX-[0-9A-Za-z_-]{28}"),
    Rule("Google OAuth token", r"\b(?:ya29\.[0-9A-Za-z_-]{30,}|1//0[0-9A-Za-z_-]{30,})"),
    Rule("Azure storage or bus key", r"(?i:AccountKey|SharedAccessKey)=([A-Za-z0-9+/]{20,}={0,2})"),
    Rule("Azure SAS signature", r"[?&;]sig=([A-Za-z0-9%+/=]{20,})"),
    Rule("Azure AD client secret", r"\b[A-Za-z0-9_~.-]{3}[0-9]Q~[A-Za-z0-9_~.-]{31,34}"),
    Rule("Alibaba access key id", r"\bLTAI[A-Za-z0-9]{17,21}\b"),
    Rule("Heroku token", r"\bHRKU-[A-Za-z0-9_-]{36,}"),
    Rule("DigitalOcean token", r"\bdo[opr]_v1_[a-f0-9]{64}"),
    Rule("Fly.io token", r"\b(?:fo1_[A-Za-z0-9_-]{30,}|fm[12][ar]?_[A-Za-z0-9+/=_-]{30,})"),
    Rule("Netlify token", r"\bnfp_[A-Za-z0-9]{36,}"),
    Rule("Render key", r"\brnd_[A-Za-z0-9]{28,}"),
    Rule("Terraform Cloud token", r"\b[A-Za-z0-9]{14}\.atlasv1\.[A-Za-z0-9_=-]{60,}"),
    Rule("Pulumi token", r"\bpul-[a-f0-9]{40}"),
    Rule("Vault token", r"\bhv[sb]\.[A-Za-z0-9_-]{24,}"),
    Rule(
        "Doppler token",
        r"\bdp\.(?:pt|st|sa|ct|scim|audit)\.(?:[a-z0-9_-]{1,32}\.)?[A-Za-z0-9]{40,44}",
    ),
    Rule("Databricks token", r"\bdapi[a-f0-9]{32}(?:-[0-9]+)?"),
    Rule("Supabase token", r"\bsbp_[a-f0-9]{40}"),
    Rule("Tailscale key", r"\btskey-[a-z]+-[A-Za-z0-9]{8,}-[A-Za-z0-9]{16,}"),
    # Code hosting, CI and registries
    Rule("GitHub token", r"\b(?:gh[pousr]_[A-Za-z0-9]{36,}|github_pat_[A-Za-z0-9_]{22,})"),
    Rule(
        "GitLab token", r"\bgl(?:pat|rt|ptt|dt|ft|soat|oas|cbt|imt|agent|ffct)-[0-9A-Za-z_-]{20,}"
    ),
    Rule("Bitbucket app password", r"\bATBB[A-Za-z0-9_=.-]{28,}"),
    Rule("Buildkite token", r"\bbkua_[a-f0-9]{40}"),
    Rule("CircleCI token", r"\bCCIPAT_[A-Za-z0-9]{20,}_[a-f0-9]{40}"),
    Rule("Sonar token", r"\bsq[pua]_[a-f0-9]{40}"),
    Rule("npm token", r"\bnpm_[A-Za-z0-9]{36}"),
    Rule("PyPI token", r"\bpypi-AgEIcHlwaS5vcmc[A-Za-z0-9_-]{50,}"),
    Rule("Docker Hub token", r"\bdckr_pat_[A-Za-z0-9_-]{27,}"),
    Rule("Hugging Face token", r"\b(?:hf_[A-Za-z0-9]{30,}|api_org_[A-Za-z0-9]{30,})"),
    # AI providers
    Rule(
        "OpenAI or Anthropic key",
        r"\bsk-(?:proj-|ant-(?:api03-|admin01-)?|svcacct-|admin-|or-v1-)?[A-Za-z0-9_-]{20,}",
    ),
    Rule("Groq key", r"\bgsk_[A-Za-z0-9]{40,}"),
    Rule("Replicate token", r"\br8_[A-Za-z0-9]{37}"),
    Rule("Perplexity key", r"\bpplx-[A-Za-z0-9]{40,}"),
    Rule("xAI key", r"\bxai-[A-Za-z0-9]{60,}"),
    Rule("Fireworks key", r"\bfw_[A-Za-z0-9]{20,}"),
    Rule("Pinecone key", r"\bpcsk_[A-Za-z0-9_]{40,}"),
    Rule("LangSmith key", r"\blsv2_(?:pt|sk)_[a-f0-9]{32}_[a-f0-9]{10}"),
    Rule("Anyscale key", r"\besecret_[a-z0-9]{20,}"),
    # Messaging, payments, SaaS
    Rule("Slack token", r"\bxox[abposre]-[0-9A-Za-z-]{10,}"),
    Rule("Slack app token", r"\bxapp-[0-9]-[A-Z0-9]{8,}-[0-9]{8,}-[a-f0-9]{32,}"),
    Rule(
        "Slack webhook URL",
        r"https://hooks\.slack\.com/(?:services|workflows|triggers)/[A-Za-z0-9/_-]{20,}",
    ),
    Rule(
        "Discord webhook URL",
        r"https://(?:(?:ptb|canary)\.)?discord(?:app)?\.com/api/webhooks/"
        r"[0-9]{17,20}/[A-Za-z0-9_-]{60,68}",
    ),
    Rule("Telegram bot token", r"(?:\b|bot)([0-9]{8,10}:AA[0-9A-Za-z_-]{33})", left=False),
    Rule("Stripe key", r"\b(?:sk|rk)_(?:live|test)_[0-9A-Za-z]{20,}"),
    Rule("Stripe webhook secret", r"\bwhsec_[0-9A-Za-z]{24,}"),
    Rule("Square token", r"\b(?:EAAA[A-Za-z0-9_-]{60}|sq0(?:atp|csp)-[0-9A-Za-z_-]{22,43})"),
    Rule("Facebook access token", r"\bEAA[B-Z][A-Za-z0-9]{40,}"),
    Rule("Twitter bearer token", r"\bA{16,}[A-Za-z0-9%]{30,}"),
    Rule("SendGrid key", r"\bSG\.[A-Za-z0-9_-]{22}\.[A-Za-z0-9_-]{43}"),
    Rule("Twilio API key", r"\bSK[0-9a-f]{32}\b"),
    Rule("Mailchimp key", r"\b[0-9a-f]{32}-us[0-9]{1,2}\b"),
    Rule("Mailgun key", r"\bkey-[0-9a-f]{32}\b"),
    Rule("Dropbox token", r"\bsl\.(?:u\.)?[A-Za-z0-9_-]{60,}"),
    Rule("Shopify token", r"\bshp(?:at|ss|ca|pa)_[a-fA-F0-9]{32}"),
    Rule("Sentry token", r"\bsntry[us]_[A-Za-z0-9_=+/-]{40,}"),
    Rule(
        "Grafana token", r"\b(?:glsa_[A-Za-z0-9]{32}_[A-Fa-f0-9]{8}|glc_[A-Za-z0-9+/]{32,}={0,2})"
    ),
    Rule("Postman key", r"\bPMAK-[a-f0-9]{24}-[a-f0-9]{34}"),
    Rule("Linear key", r"\blin_api_[A-Za-z0-9]{40}"),
    Rule("New Relic key", r"\bNR(?:AK|II|JS|RA)-[A-Za-z0-9]{27}"),
    Rule("Atlassian token", r"\bATATT3[A-Za-z0-9_=-]{150,}"),
    Rule("Figma token", r"\bfig[dhu]_[A-Za-z0-9_-]{40,}"),
    Rule("Notion token", r"\b(?:ntn_[A-Za-z0-9]{40,}|secret_[A-Za-z0-9]{43})"),
    Rule("Airtable token", r"\bpat[A-Za-z0-9]{14}\.[a-f0-9]{64}"),
    Rule("Contentful token", r"\bCFPAT-[A-Za-z0-9_-]{43}"),
    Rule("Dynatrace token", r"\bdt0c01\.[A-Z0-9]{24}\.[A-Z0-9]{64}"),
    Rule("PlanetScale token", r"\bpscale_(?:pw|tkn|oauth)_[A-Za-z0-9_.-]{32,}"),
    Rule("Okta token", r"\bSSWS[ \t]+([A-Za-z0-9_-]{40,})"),
    Rule("age secret key", r"\bAGE-SECRET-KEY-1[QPZRY9X8GF2TVDW0S3JN54KHCE6MUA7L]{58}"),
    Rule("1Password service account token", r"\bops_eyJ[A-Za-z0-9+/=]{100,}"),
    # Generic shapes
    Rule("JWT", rf"\beyJ[{_B64URL}]{{10,}}\.[{_B64URL}]{{10,}}\.[{_B64URL}]{{10,}}"),
    Rule("Bearer token", r"(?i:\bbearer[ \t]+)([A-Za-z0-9._~+/%-]{20,}=*)"),
    Rule("Basic credentials", r"(?i:\bbasic[ \t]+)([A-Za-z0-9+/]{8,}={0,2})", _basic),
    Rule(
        "Credentials in a URL",
        r"[A-Za-z][A-Za-z0-9+.-]{1,20}://([^\s:/?#@\[\]\"'<>]*:[^\s/?#@\"'<>]+)@",
        _user_password,
    ),
    Rule(
        "Private key block",
        r"(?s)-----BEGIN[A-Z0-9 ]{0,40}PRIVATE KEY(?: BLOCK)?-----.*?"
        r"(?:-----END[A-Z0-9 ]{0,40}PRIVATE KEY(?: BLOCK)?-----|\z)",
    ),
    Rule(
        "PuTTY private key",
        r"(?s)PuTTY-User-Key-File-[0-9]:.*?(?:Private-MAC:[ \t]*[0-9a-fA-F]+|\z)",
    ),
    # Passwords on command lines and in .netrc
    Rule(".netrc password", r"\bmachine\s+\S+\s+login\s+\S+\s+password\s+(\S+)"),
    Rule("sshpass password", r"\bsshpass\s+-p\s*['\"]?([^\s'\"]+)"),
    Rule(
        "MySQL client password",
        r"\bmysql(?:dump|admin)?\s(?:[^\n]*?\s)?-p['\"]?([^\s'\"-][^\s'\"]*)",
    ),
    Rule(
        "curl credentials",
        r"\bcurl\s(?:[^\n]*?\s)?(?:-u|--user)[ \t]*['\"]?[^\s:'\"]+:([^\s'\"]+)",
    ),
    Rule(
        "Password option",
        r"(?:^|\s)--?(?:password|passwd|pass)[= \t]['\"]?([^\s'\"]{6,})",
        secret_value,
    ),
    Rule("Assignment", ASSIGNMENT),  # its check is :func:`assigned`
)
"""The project's rules, in the order they are reported."""


def assigned(match_groups: tuple[str | None, ...]) -> tuple[int, str] | None:
    """Of an :data:`ASSIGNMENT` match's groups (the name in two, then the value's spellings):
    which group holds the value and the value, when the name names a secret and the value
    is one."""
    name = (match_groups[0] or "") + (match_groups[1] or "")
    if not names_secret(name):
        return None
    for index, found in enumerate(match_groups[2:], start=3):
        if found is not None:
            value = found.rstrip(".,:?")  # a sentence's own punctuation
            quoted = index not in _BARE_GROUPS
            if len(value) > _LONGEST or (quoted and " " in value and len(value) > _PHRASE):
                return None  # text, not a secret
            return (index, value) if secret_value(value, quoted=quoted) else None
    return None


_BARE_GROUPS = (6, 10)
_LONGEST = 4096  # characters of a value (an STS session token is about 1,000)
_PHRASE = 64  # characters of a quoted value with spaces (a passphrase, not a sentence)
