"""A set of credential formats and benign look-alikes for the ``secrets`` redaction
(DESIGN.md section 10): each credential is made of synthetic characters (a hash of its
format's name, never a real secret), in a sentence; redaction must replace it whole, and
leave every look-alike unchanged. ``tests/unit/privacy/test_secret_coverage.py`` holds the
detectors to it; ``python -m tests.unit.privacy.secret_cases`` prints the numbers."""

from __future__ import annotations

import base64
import hashlib
import re
import string

UPPER_DIGITS = string.ascii_uppercase + string.digits
ALNUM = string.ascii_letters + string.digits
HEX = "0123456789abcdef"
B64URL = ALNUM + "-_"
BECH32 = "QPZRY9X8GF2TVDW0S3JN54KHCE6MUA7L"


def tok(name: str, alphabet: str, n: int) -> str:
    """``n`` characters of ``alphabet``, derived from ``name`` (synthetic, deterministic)."""
    out: list[str] = []
    block = 0
    while len(out) < n:
        digest = hashlib.sha256(f"{name}/{block}".encode()).digest()
        out += [alphabet[b % len(alphabet)] for b in digest]
        block += 1
    return "".join(out[:n])


def _pem() -> str:
    body = base64.b64encode(hashlib.sha512(b"pem").digest() * 4).decode()
    lines = "\n".join(body[i : i + 64] for i in range(0, len(body), 64))
    return f"-----BEGIN RSA PRIVATE KEY-----\n{lines}\n-----END RSA PRIVATE KEY-----"


def _jwt() -> str:
    head = base64.urlsafe_b64encode(b'{"alg":"HS256","typ":"JWT"}').decode().rstrip("=")
    body = base64.urlsafe_b64encode(b'{"sub":"u-1","iat":1700000000}').decode().rstrip("=")
    return f"{head}.{body}.{tok('jwt', B64URL, 43)}"


def _basic() -> str:
    return base64.b64encode(f"alice:{tok('basic-pw', ALNUM, 14)}".encode()).decode()


# (format, text before, the credential, text after): the credential must be replaced whole.
CREDENTIALS: list[tuple[str, str, str, str]] = [
    ("AWS access key id", "aws key ", "AKIA" + tok("aws", UPPER_DIGITS, 16), " in the env"),
    ("AWS secret access key", "aws_secret_access_key = ", tok("awss", ALNUM + "+/", 40), ""),
    ("GitHub classic token", "use ", "ghp_" + tok("ghp", ALNUM, 36), " to push"),
    ("GitHub OAuth token", "token ", "gho_" + tok("gho", ALNUM, 36), "."),
    (
        "GitHub fine-grained token",
        "pat ",
        "github_pat_" + tok("ghf1", ALNUM, 22) + "_" + tok("ghf2", ALNUM, 59),
        " ok",
    ),
    ("GitLab personal token", "glab ", "glpat-" + tok("glpat", B64URL, 20), " set"),
    ("GitLab runner token", "runner ", "glrt-" + tok("glrt", B64URL, 20), " set"),
    (
        "Slack bot token",
        "slack ",
        "xoxb-"
        + tok("x1", string.digits, 12)
        + "-"
        + tok("x2", string.digits, 13)
        + "-"
        + tok("x3", ALNUM, 24),
        " now",
    ),
    (
        "Slack webhook URL",
        "post to ",
        "https://hooks.slack.com/services/T"
        + tok("s1", UPPER_DIGITS, 8)
        + "/B"
        + tok("s2", UPPER_DIGITS, 8)
        + "/"
        + tok("s3", ALNUM, 24),
        " please",
    ),
    ("Stripe secret key", "stripe ", "sk_live_" + tok("sk_live", ALNUM, 40), " here"),
    ("Stripe restricted key", "stripe ", "rk_live_" + tok("rk_live", ALNUM, 40), " here"),
    ("Stripe webhook secret", "hook ", "whsec_" + tok("whsec", ALNUM, 32), " here"),
    ("OpenAI project key", "openai ", "sk-proj-" + tok("oai", B64URL, 48), " ok"),
    ("Anthropic key", "claude ", "sk-ant-api03-" + tok("ant", B64URL, 93) + "AA", " ok"),
    ("Google API key", "maps ", "AIza" + tok("aiza", B64URL, 35), " ok"),
    ("Hugging Face token", "hub ", "hf_" + tok("hf", ALNUM, 34), " ok"),
    ("npm access token", "npm ", "npm_" + tok("npm", ALNUM, 36), " ok"),
    ("PyPI upload token", "twine ", "pypi-AgEIcHlwaS5vcmc" + tok("pypi", B64URL, 60), " ok"),
    (
        "Discord webhook URL",
        "notify ",
        "https://discord.com/api/webhooks/"
        + tok("dw1", string.digits, 18)
        + "/"
        + tok("dw2", B64URL, 68),
        " please",
    ),
    (
        "Discord bot token",
        "bot ",
        "M" + tok("db1", ALNUM, 23) + "." + tok("db2", B64URL, 6) + "." + tok("db3", B64URL, 27),
        " ok",
    ),
    (
        "Telegram bot token",
        "tg ",
        tok("tg1", string.digits, 10) + ":AA" + tok("tg2", B64URL, 33),
        " ok",
    ),
    ("SendGrid key", "mail ", "SG." + tok("sg1", B64URL, 22) + "." + tok("sg2", B64URL, 43), " ok"),
    ("Twilio API key", "twilio ", "SK" + tok("tw", HEX, 32), " ok"),
    ("Mailchimp key", "mc ", tok("mc", HEX, 32) + "-us12", " ok"),
    ("Shopify access token", "shop ", "shpat_" + tok("shpat", HEX, 32), " ok"),
    ("Shopify shared secret", "shop ", "shpss_" + tok("shpss", HEX, 32), " ok"),
    ("Docker Hub token", "docker ", "dckr_pat_" + tok("dckr", B64URL, 27), " ok"),
    ("DigitalOcean token", "do ", "dop_v1_" + tok("dop", HEX, 64), " ok"),
    ("Databricks token", "dbx ", "dapi" + tok("dapi", HEX, 32), " ok"),
    ("Sentry user token", "sentry ", "sntryu_" + tok("sntry", HEX, 64), " ok"),
    (
        "Grafana service account token",
        "grafana ",
        "glsa_" + tok("glsa1", ALNUM, 32) + "_" + tok("glsa2", HEX, 8),
        " ok",
    ),
    (
        "Postman API key",
        "postman ",
        "PMAK-" + tok("pm1", HEX, 24) + "-" + tok("pm2", HEX, 34),
        " ok",
    ),
    ("Linear API key", "linear ", "lin_api_" + tok("lin", ALNUM, 40), " ok"),
    ("HashiCorp Vault token", "vault ", "hvs." + tok("hvs", B64URL, 90), " ok"),
    ("Doppler token", "doppler ", "dp.pt." + tok("dp", ALNUM, 43), " ok"),
    ("New Relic user key", "nr ", "NRAK-" + tok("nrak", UPPER_DIGITS, 27), " ok"),
    ("Atlassian API token", "jira ", "ATATT3xFfGF0" + tok("atatt", B64URL, 180), " ok"),
    ("age secret key", "age ", "AGE-SECRET-KEY-1" + tok("age", BECH32, 58), " ok"),
    ("Supabase token", "supabase ", "sbp_" + tok("sbp", HEX, 40), " ok"),
    ("Figma token", "figma ", "figd_" + tok("figd", B64URL, 40), " ok"),
    ("Groq key", "groq ", "gsk_" + tok("gsk", ALNUM, 52), " ok"),
    ("Replicate token", "replicate ", "r8_" + tok("r8", ALNUM, 37), " ok"),
    ("Perplexity key", "pplx ", "pplx-" + tok("pplx", ALNUM, 48), " ok"),
    ("xAI key", "grok ", "xai-" + tok("xai", ALNUM, 80), " ok"),
    ("Square access token", "square ", "EAAA" + tok("eaaa", B64URL, 60), " ok"),
    ("Alibaba access key id", "aliyun ", "LTAI" + tok("ltai", ALNUM, 20), " ok"),
    ("Notion token", "notion ", "ntn_" + tok("ntn", ALNUM, 46), " ok"),
    (
        "Azure storage account key",
        "DefaultEndpointsProtocol=https;AccountName=acme;AccountKey=",
        base64.b64encode(hashlib.sha512(b"azure").digest()).decode(),
        ";EndpointSuffix=core",
    ),
    ("Private key block", "key:\n", _pem(), "\nend"),
    ("JWT", "session ", _jwt(), " ok"),
    (
        "HTTP Basic credentials in a URL",
        "fetch https://",
        "alice:" + tok("urlpw", ALNUM, 16),
        "@api.example.com/v1",
    ),
    ("Database URL password", "postgres://app:", tok("dbpw", ALNUM, 18), "@db.internal:5432/app"),
    ("Authorization: Basic header", "Authorization: Basic ", _basic(), ""),
    ("Bearer token", "Authorization: Bearer ", tok("bearer", ALNUM + "._-", 40), ""),
    ("Password assigned to a name", 'password="', tok("pw", ALNUM + "!#%", 16), '"'),
]

# Text that looks like a credential and is none: redaction must leave it exactly as it is.
BENIGN: list[tuple[str, str]] = [
    ("UUID", "request 550e8400-e29b-41d4-a716-446655440000 failed"),
    ("git SHA", "fixed in commit " + hashlib.sha1(b"c").hexdigest()),
    ("short git SHA", "see 3f2a9c1 and a1b2c3d"),
    ("SHA-256", "sha256 " + hashlib.sha256(b"x").hexdigest()),
    ("image digest", "image@sha256:" + hashlib.sha256(b"img").hexdigest()),
    ("MD5", "md5 " + hashlib.md5(b"y").hexdigest()),  # a look-alike, not a use
    ("base64 image", "data:image/png;base64," + base64.b64encode(bytes(range(256)) * 3).decode()),
    ("long identifier", "call customer_support_refund_flow_handler_v2_with_retries_enabled()"),
    ("sk- in prose", "we use the sk-learn style API and a task-specific model"),
    ("ULID", "event 01HZXW3KQ8G8N2M6T5Y4R3P2Q1 arrived"),
    ("AWS ARN", "role arn:aws:iam::123456789012:role/Admin"),
    ("Kubernetes pod name", "pod web-7d4b9c8f6d-x2x9z restarted"),
    ("URL without credentials", "see https://example.com/docs/api?version=2&page=3#auth"),
    ("basic in prose", "a basic understanding of authentication is enough"),
    ("token counts", '{"max_tokens": 4096, "token_count": 1234, "key": "value"}'),
    ("API key in prose", "the api key is stored in the vault, ask the admin"),
    ("npm command", "run npm install left-pad and npm_config_cache"),
    ("Discord invite", "join https://discord.com/invite/rlexport"),
    ("datetime and version", "v1.2.3 released 2026-01-02T03:04:05.123456Z"),
    ("hex colours", "colours #ff00ff #00ff00 #123456"),
    ("file path", "/home/app/.cache/huggingface/hub/models--org--name/snapshots/main"),
    ("Python traceback", 'File "/app/handler.py", line 42, in handle_refund_request'),
    ("email-like", "ping ops-team at the usual channel"),
    ("trace id", "trace tr-000123 of scenario refund"),
]


_PIECE = 6  # a run this long of the credential left in the output is a tail


def replaced_whole(out: str, before: str, secret: str, after: str) -> bool:
    """Whether the redacted sentence ``out`` holds a placeholder and no run of
    :data:`_PIECE` characters of the credential (runs that its context holds aside)."""
    context = before + after
    pieces = {secret[i : i + _PIECE] for i in range(len(secret) - _PIECE + 1)}
    rest = re.sub(r"\[REDACTED:[A-Z_]+\]", "\0", out)  # a placeholder is no piece of it
    return rest != out and not any(p in rest for p in pieces if p not in context)


def measure(redact: object) -> tuple[list[str], list[str]]:
    """(formats not replaced whole, look-alikes changed) under ``redact(text) -> text``."""
    missed = [
        name for name, before, secret, after in CREDENTIALS
        if not replaced_whole(redact(before + secret + after), before, secret, after)  # type: ignore[operator]  # a callable
    ]  # fmt: skip
    changed = [name for name, text in BENIGN if redact(text) != text]  # type: ignore[operator]  # a callable
    return missed, changed


if __name__ == "__main__":
    from rl_export.privacy.redact import redactor

    scrub = redactor(("secrets",))
    missed, changed = measure(lambda text: scrub.text(text)[0])
    found = len(CREDENTIALS) - len(missed)
    print(f"credentials replaced whole: {found}/{len(CREDENTIALS)} "
          f"({100 * found / len(CREDENTIALS):.1f} %); missed: {missed}")  # fmt: skip
    print(f"look-alikes changed: {len(changed)}/{len(BENIGN)}: {changed}")
