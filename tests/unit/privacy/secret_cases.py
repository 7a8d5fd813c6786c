"""A coverage set for the ``secrets`` redaction (DESIGN.md section 10), of this project's own
making: credentials of many formats, benign look-alikes, and prose that uses ``password``,
``secret``, ``token`` and ``key`` as words.

Every credential is synthetic: its characters are derived from a hash of its format's name
(:func:`tok`), in the shape its vendor documents (prefix, alphabet, length, checksum-free),
inside the text an agent's transcript would carry it in (a shell command, a config file, a
JSON tool call, a sentence). None is copied from a package's tests, and the formats issue 53
reported as missed are kept apart (:data:`REPORTED`), so that this set says how the rules
do on formats nobody tuned them for.

A credential counts when it is replaced whole (no run of :data:`PIECE` of its characters
left) and the text around it is kept (:func:`context_kept`: everything up to the last
separator before it and from the first one after it). A look-alike or a sentence counts when
it comes out byte for byte. ``tests/unit/privacy/test_secret_coverage.py`` holds the
redaction to it; ``python -m tests.perf.bench_redact`` prints the numbers.
"""

from __future__ import annotations

import base64
import hashlib
import json
import re
import string
from collections.abc import Callable

UPPER_DIGITS = string.ascii_uppercase + string.digits
LOWER_DIGITS = string.ascii_lowercase + string.digits
ALNUM = string.ascii_letters + string.digits
HEX = "0123456789abcdef"
B64 = ALNUM + "+/"
B64URL = ALNUM + "-_"
BECH32 = "QPZRY9X8GF2TVDW0S3JN54KHCE6MUA7L"
BASE32 = string.ascii_lowercase + "234567"


def tok(name: str, alphabet: str, n: int) -> str:
    """``n`` characters of ``alphabet``, derived from ``name`` (synthetic, deterministic)."""
    out: list[str] = []
    block = 0
    while len(out) < n:
        digest = hashlib.sha256(f"{name}/{block}".encode()).digest()
        out += [alphabet[b % len(alphabet)] for b in digest]
        block += 1
    return "".join(out[:n])


def b64(name: str, size: int) -> str:
    """Standard base64 of ``size`` synthetic bytes."""
    data = b"".join(hashlib.sha512(f"{name}/{i}".encode()).digest() for i in range(size // 64 + 1))
    return base64.b64encode(data[:size]).decode()


def pem(label: str, name: str, lines: int = 6) -> str:
    body = b64(name, 48 * lines)
    rows = "\n".join(body[i : i + 64] for i in range(0, len(body), 64))
    return f"-----BEGIN {label}-----\n{rows}\n-----END {label}-----"


def jwt(name: str) -> str:
    def part(obj: dict[str, object]) -> str:
        return base64.urlsafe_b64encode(json.dumps(obj).encode()).decode().rstrip("=")

    head = part({"alg": "RS256", "typ": "JWT", "kid": tok(name + "k", HEX, 8)})
    body = part({"sub": tok(name + "s", LOWER_DIGITS, 12), "iat": 1767225600, "scope": "read"})
    return f"{head}.{body}.{tok(name, B64URL, 86)}"


# (format, text before, the credential, text after)
Case = tuple[str, str, str, str]

CREDENTIALS: list[Case] = [
    # Cloud and infrastructure
    (
        "AWS access key id",
        "aws configure set aws_access_key_id ",
        "AKIA" + tok("aws-id", UPPER_DIGITS, 16),
        " --profile ci",
    ),
    (
        "AWS secret access key",
        "[ci]\naws_secret_access_key = ",
        tok("aws-secret", B64, 40),
        "\nregion = eu-west-1",
    ),
    (
        "AWS session token",
        "export AWS_SESSION_TOKEN=",
        "IQoJb3JpZ2luX2VjE" + tok("aws-sts", B64, 340),
        "\n$ aws s3 ls",
    ),
    (
        "Google API key",
        "curl 'https://maps.example.com/geocode?key=",
        "AIza" + tok("gapi", B64URL, 35),
        "&address=Berlin'",
    ),
    (
        "GCP service account key",
        '{"type": "service_account", "private_key": "',
        pem("PRIVATE KEY", "gcp-sa").replace("\n", "\\n") + "\\n",
        '", "client_email": "ci"}',
    ),
    (
        "Azure storage account key",
        "DefaultEndpointsProtocol=https;AccountName=acmelogs;AccountKey=",
        b64("az-st", 64),
        ";EndpointSuffix=core.windows.net",
    ),
    (
        "Azure Service Bus key",
        "Endpoint=sb://acme-events.servicebus.windows.net/;SharedAccessKeyName=send;"
        "SharedAccessKey=",
        b64("az-sb", 32),
        "",
    ),
    (
        "Azure Cosmos DB key",
        "AccountEndpoint=https://acme-db.documents.azure.com:443/;AccountKey=",
        b64("az-cosmos", 64),
        ";",
    ),
    ("DigitalOcean token", "doctl auth init -t ", "dop_v1_" + tok("do", HEX, 64), ""),
    ("Heroku API key", "HEROKU_API_KEY=", "HRKU-AA" + tok("heroku", B64URL, 58), " heroku ps"),
    ("Vault token", "VAULT_TOKEN=", "hvs." + tok("vault", B64URL, 91), " vault kv get secret/app"),
    (
        "Doppler service token",
        "doppler run --token ",
        "dp.st.prd." + tok("doppler", ALNUM, 43),
        " -- ./start",
    ),
    ("Databricks token", "databricks configure --token ", "dapi" + tok("dbx", HEX, 32), " -p ws"),
    ("Supabase access token", "supabase login --token ", "sbp_" + tok("sbp", HEX, 40), ""),
    (
        "Tailscale auth key",
        "tailscale up --authkey=",
        "tskey-auth-" + tok("ts1", ALNUM, 12) + "CNTRL-" + tok("ts2", ALNUM, 33),
        " --ssh",
    ),
    ("Alibaba access key id", "ALIBABA_CLOUD_ACCESS_KEY_ID=", "LTAI" + tok("ali", ALNUM, 20), "\n"),
    # Code hosting, CI, registries
    (
        "GitHub classic token",
        "git clone https://x-access-token@github.com/acme/app && gh auth login --with-token <<< ",
        "ghp_" + tok("ghp", ALNUM, 36),
        "",
    ),
    ("GitHub OAuth token", "token from the device flow: ", "gho_" + tok("gho", ALNUM, 36), "."),
    ("GitHub app token", "installation token ", "ghs_" + tok("ghs", ALNUM, 36), " (1 h)"),
    (
        "GitHub fine-grained token",
        "GH_TOKEN=",
        "github_pat_11" + tok("ghf1", UPPER_DIGITS, 20) + "_" + tok("ghf2", ALNUM, 59),
        " gh pr list",
    ),
    ("GitLab personal token", "glab auth login --token ", "glpat-" + tok("glpat", B64URL, 20), ""),
    (
        "GitLab runner token",
        "gitlab-runner register --token ",
        "glrt-" + tok("glrt", B64URL, 20),
        "",
    ),
    (
        "GitLab deploy token",
        "deploy token ",
        "gldt-" + tok("gldt", B64URL, 20),
        " for the registry",
    ),
    ("Bitbucket app password", "BITBUCKET_APP_PASSWORD=", "ATBB" + tok("atbb", ALNUM, 32), "\n"),
    ("Buildkite token", "BUILDKITE_API_TOKEN=", "bkua_" + tok("bk", HEX, 40), " bk build list"),
    (
        "CircleCI token",
        "circleci setup --token ",
        "CCIPAT_" + tok("cci1", ALNUM, 22) + "_" + tok("cci2", HEX, 40),
        "",
    ),
    ("SonarQube token", "sonar-scanner -Dsonar.token=", "squ_" + tok("sonar", HEX, 40), ""),
    ("npm token", "//registry.npmjs.org/:_authToken=", "npm_" + tok("npm", ALNUM, 36), "\n"),
    (
        "PyPI token",
        "twine upload -u __token__ -p ",
        "pypi-AgEIcHlwaS5vcmc" + tok("pypi", B64URL, 64),
        " dist/*",
    ),
    (
        "Docker Hub token",
        "echo ",
        "dckr_pat_" + tok("dckr", B64URL, 27),
        " | docker login -u acme --password-stdin",
    ),
    ("Hugging Face token", "huggingface-cli login --token ", "hf_" + tok("hf", ALNUM, 34), ""),
    # AI providers
    ("OpenAI project key", 'client = OpenAI(api_key="', "sk-proj-" + tok("oai", B64URL, 120), '")'),
    (
        "OpenAI service account key",
        "OPENAI_API_KEY=",
        "sk-svcacct-" + tok("oai-sa", B64URL, 120),
        "\n",
    ),
    ("Anthropic key", "x-api-key: ", "sk-ant-api03-" + tok("ant", B64URL, 93) + "AA", "\n"),
    ("Groq key", "GROQ_API_KEY=", "gsk_" + tok("groq", ALNUM, 52), " python app.py"),
    ("Replicate token", "REPLICATE_API_TOKEN=", "r8_" + tok("r8", ALNUM, 37), "\n"),
    ("Perplexity key", "Authorization: Bearer ", "pplx-" + tok("pplx", ALNUM, 48), "\n"),
    ("xAI key", 'headers = {"Authorization": "Bearer ', "xai-" + tok("xai", ALNUM, 80), '"}'),
    ("OpenRouter key", "OPENROUTER_API_KEY=", "sk-or-v1-" + tok("or", HEX, 64), "\n"),
    (
        "LangSmith key",
        "LANGSMITH_API_KEY=",
        "lsv2_pt_" + tok("ls1", HEX, 32) + "_" + tok("ls2", HEX, 10),
        "\n",
    ),
    ("Pinecone key", "pc = Pinecone(api_key='", "pcsk_" + tok("pc", ALNUM, 60), "')"),
    # Messaging, payments, SaaS
    (
        "Slack bot token",
        "SLACK_BOT_TOKEN=",
        "xoxb-"
        + tok("x1", "0123456789", 12)
        + "-"
        + tok("x2", "0123456789", 13)
        + "-"
        + tok("x3", ALNUM, 24),
        "\n",
    ),
    (
        "Slack user token",
        "token ",
        "xoxp-"
        + tok("p1", "0123456789", 12)
        + "-"
        + tok("p2", "0123456789", 12)
        + "-"
        + tok("p3", "0123456789", 13)
        + "-"
        + tok("p4", HEX, 32),
        " expired",
    ),
    (
        "Slack webhook URL",
        "curl -X POST ",
        "https://hooks.slack.com/services/T"
        + tok("s1", UPPER_DIGITS, 10)
        + "/B"
        + tok("s2", UPPER_DIGITS, 10)
        + "/"
        + tok("s3", ALNUM, 24),
        " -d @msg.json",
    ),
    (
        "Discord webhook URL",
        "webhook: ",
        "https://discord.com/api/webhooks/"
        + tok("dw1", "0123456789", 19)
        + "/"
        + tok("dw2", B64URL, 68),
        "\n",
    ),
    (
        "Telegram bot token",
        "curl https://api.telegram.org/bot",
        tok("tg1", "0123456789", 10) + ":AA" + tok("tg2", B64URL, 33),
        "/getMe",
    ),
    ("Stripe secret key", "stripe listen --api-key ", "sk_live_51" + tok("sk", ALNUM, 96), ""),
    ("Stripe restricted key", "STRIPE_KEY=", "rk_live_51" + tok("rk", ALNUM, 96), "\n"),
    ("Stripe webhook secret", "STRIPE_WEBHOOK_SECRET=", "whsec_" + tok("whsec", ALNUM, 32), "\n"),
    ("Square access token", "SQUARE_ACCESS_TOKEN=", "EAAA" + tok("sq", B64URL, 60), "\n"),
    (
        "SendGrid key",
        "sg = SendGridAPIClient('",
        "SG." + tok("sg1", B64URL, 22) + "." + tok("sg2", B64URL, 43),
        "')",
    ),
    (
        "Mailchimp key",
        "mailchimp.setConfig({apiKey: '",
        tok("mc", HEX, 32) + "-us21",
        "', server: 'us21'})",
    ),
    ("Shopify access token", "X-Shopify-Access-Token: ", "shpat_" + tok("shp", HEX, 32), "\n"),
    ("Sentry auth token", "SENTRY_AUTH_TOKEN=", "sntryu_" + tok("sentry", HEX, 64), " sentry-cli"),
    (
        "Grafana service account token",
        "GRAFANA_TOKEN=",
        "glsa_" + tok("gl1", ALNUM, 32) + "_" + tok("gl2", HEX, 8),
        "\n",
    ),
    (
        "Postman API key",
        "postman login --with-api-key ",
        "PMAK-" + tok("pm1", HEX, 24) + "-" + tok("pm2", HEX, 34),
        "",
    ),
    ("Linear API key", "LINEAR_API_KEY=", "lin_api_" + tok("lin", ALNUM, 40), "\n"),
    ("New Relic user key", "NEW_RELIC_API_KEY=", "NRAK-" + tok("nr", UPPER_DIGITS, 27), "\n"),
    (
        "Atlassian API token",
        "curl -u dev@acme.example:",
        "ATATT3xFfGF0" + tok("atl", B64URL, 180),
        " https://acme.atlassian.net/rest/api/3/myself",
    ),
    ("Figma token", "X-Figma-Token: ", "figd_" + tok("figma", B64URL, 40), "\n"),
    ("Notion token", "NOTION_TOKEN=", "ntn_" + tok("notion", ALNUM, 46), "\n"),
    (
        "Airtable token",
        "AIRTABLE_TOKEN=",
        "pat" + tok("at1", ALNUM, 14) + "." + tok("at2", HEX, 64),
        "\n",
    ),
    (
        "Contentful token",
        "contentful login --management-token ",
        "CFPAT-" + tok("cf", B64URL, 43),
        "",
    ),
    (
        "Dynatrace token",
        "Api-Token ",
        "dt0c01." + tok("dt1", UPPER_DIGITS, 24) + "." + tok("dt2", UPPER_DIGITS, 64),
        "\n",
    ),
    ("PlanetScale password", "PLANETSCALE_PASSWORD=", "pscale_pw_" + tok("ps", B64URL, 43), "\n"),
    (
        "age secret key",
        "# created: 2026-01-02\n",
        "AGE-SECRET-KEY-1" + tok("age", BECH32, 58),
        "\n",
    ),
    ("Okta API token", "Authorization: SSWS ", "00" + tok("okta", B64URL, 40), "\n"),
    # Generic shapes
    ("JWT", "Cookie: session=", jwt("session"), "; Path=/; HttpOnly"),
    ("Bearer token", "Authorization: Bearer ", tok("bearer", ALNUM + "._~", 48), "\n"),
    (
        "Basic credentials",
        "Authorization: Basic ",
        base64.b64encode(f"deploy:{tok('basic', ALNUM, 18)}".encode()).decode(),
        "\n",
    ),
    ("RSA private key", "id_rsa:\n", pem("RSA PRIVATE KEY", "rsa"), "\n"),
    ("EC private key", "key.pem\n", pem("EC PRIVATE KEY", "ec", 3), "\n"),
    (
        "OpenSSH private key",
        "cat ~/.ssh/id_ed25519\n",
        pem("OPENSSH PRIVATE KEY", "ssh", 5),
        "\n$ ",
    ),
    ("Encrypted private key", "tls.key: |\n", pem("ENCRYPTED PRIVATE KEY", "enc", 8), "\n"),
    # Credentials in URLs and connection strings
    (
        "PostgreSQL URL",
        "DATABASE_URL=postgres://",
        "app:" + tok("pg", ALNUM, 20),
        "@db.internal:5432/app?sslmode=require",
    ),
    ("Redis URL", "REDIS_URL=rediss://", ":" + tok("redis", ALNUM, 24), "@cache.internal:6380/0"),
    (
        "MongoDB URL",
        "mongosh 'mongodb+srv://",
        "admin:" + tok("mongo", ALNUM, 16),
        "@cluster0.ab1cd.mongodb.net/prod?retryWrites=true'",
    ),
    ("AMQP URL", "BROKER_URL=amqps://", "worker:" + tok("amqp", ALNUM, 18), "@mq.internal/vhost"),
    (
        "HTTPS credentials",
        "pip install --index-url https://",
        "ci:" + tok("idx", ALNUM, 22),
        "@pypi.acme.internal/simple app",
    ),
    (
        "JDBC PostgreSQL password",
        "jdbc:postgresql://db:5432/app?user=app&password=",
        tok("jdbc-pg", ALNUM + "!#", 16),
        "&ssl=true",
    ),
    (
        "JDBC SQL Server password",
        "jdbc:sqlserver://sql.internal:1433;databaseName=app;user=app;password=",
        tok("jdbc-ms", ALNUM + "!#", 16),
        ";encrypt=true",
    ),
    (
        "libpq conninfo password",
        "psql 'host=db port=5432 user=app password=",
        tok("libpq", ALNUM + "!#", 16),
        " dbname=app sslmode=require'",
    ),
    (
        "ADO.NET password",
        "Server=tcp:acme.database.windows.net,1433;Database=app;User ID=app;Password=",
        tok("ado", ALNUM + "!#", 16),
        ";Encrypt=True;",
    ),
    # Assignments and command lines
    (".env password", "DB_PASSWORD=", tok("env", ALNUM + "!%", 18), "\nDB_HOST=db"),
    (
        "YAML client secret",
        "oauth:\n  client_id: acme-web\n  client_secret: ",
        tok("yaml", ALNUM + "-_", 32),
        "\n  redirect: /cb",
    ),
    ("JSON API key", '{"service": "geo", "api_key": "', tok("json", ALNUM, 32), '", "retries": 3}'),
    (
        "Python keyword password",
        "conn = connect(host='db', user='app', password='",
        tok("kw", ALNUM + "!@#", 16),
        "')",
    ),
    (
        "Django secret key",
        "SECRET_KEY = 'django-insecure-",
        tok("dj", ALNUM + "!@#$%^&*(-_=+)", 50).replace("'", ""),
        "'",
    ),
    ("PGPASSWORD", "PGPASSWORD=", tok("pgpw", ALNUM, 20), " psql -h db -U app"),
    ("sshpass", "sshpass -p '", tok("sshpass", ALNUM + "!#", 14), "' ssh deploy@10.0.0.5"),
    ("MySQL client password", "mysql -h db -u root -p", tok("mysql", ALNUM, 16), " app < dump.sql"),
    (
        "curl user and password",
        "curl -u ",
        "admin:" + tok("curl", ALNUM + "!#", 16),
        " https://jenkins.internal/api/json",
    ),
    ("Kaggle key", '{"username": "acme-ml", "key": "', tok("kaggle", HEX, 32), '"}'),
    ("Weights & Biases key", "WANDB_API_KEY=", tok("wandb", HEX, 40), " wandb login"),
    (
        "Password option",
        "backup-tool --user ops --password ",
        tok("opt", ALNUM + "!#", 16),
        " --target s3",
    ),
    ("Hex encryption key", "ENCRYPTION_KEY=", tok("enc-hex", HEX, 64), "\n"),
    ("Base64 signing key", "JWT_SIGNING_KEY=", b64("sign", 32), "\n"),
]
"""Credentials of formats in common use (issue 53's reported formats are in REPORTED)."""


REPORTED: list[Case] = [
    (
        "Google OAuth client secret",
        '"client_secret": "',
        "GOCSPX-" + tok("gocspx", B64URL, 28),
        '"',
    ),
    (
        "Google OAuth access token",
        "Authorization: Bearer ",
        "ya29." + tok("ya29", B64URL, 150),
        "\n",
    ),
    (
        "Azure AD client secret",
        "AZURE_CLIENT_SECRET=",
        tok("aad1", ALNUM, 3) + "8Q~" + tok("aad2", ALNUM + "_~.-", 34),
        "\n",
    ),
    (
        "Azure SAS signature",
        "https://acme.blob.core.windows.net/logs/a.txt?sv=2024-11-04&se=2026-02-01&sp=r&sig=",
        tok("sas", ALNUM, 43) + "%3D",
        "",
    ),
    ("Mailgun key", "api:", "key-" + tok("mailgun", HEX, 32), ""),
    ("Dropbox token", "DROPBOX_TOKEN=", "sl.u." + tok("dropbox", B64URL, 140), "\n"),
    ("Facebook token", "access_token=", "EAAG" + tok("fb", ALNUM, 180), "&fields=id"),
    (
        "Twitter bearer token",
        "Authorization: Bearer ",
        "AAAAAAAAAAAAAAAAAAAAA" + tok("tw1", ALNUM, 24) + "%3D" + tok("tw2", ALNUM, 50),
        "\n",
    ),
    (
        "Terraform token",
        'token = "',
        tok("tf1", ALNUM, 14) + ".atlasv1." + tok("tf2", B64URL, 67),
        '"',
    ),
    ("Pulumi token", "PULUMI_ACCESS_TOKEN=", "pul-" + tok("pul", HEX, 40), "\n"),
    ("Fly.io token", "fly deploy --access-token ", "fo1_" + tok("fly", B64URL, 43), ""),
    ("Netlify token", "NETLIFY_AUTH_TOKEN=", "nfp_" + tok("nfp", ALNUM, 40), "\n"),
    ("Render key", "RENDER_API_KEY=", "rnd_" + tok("rnd", ALNUM, 32), "\n"),
    (
        "Mapbox secret token",
        "MAPBOX_TOKEN=",
        "sk.eyJ1IjoiYWNtZSIsImEiOiJ" + tok("mb1", B64URL, 20) + "." + tok("mb2", B64URL, 22),
        "\n",
    ),
    ("Fireworks key", "FIREWORKS_API_KEY=", "fw_" + tok("fw", ALNUM, 24), "\n"),
    ("PGP private key", "", pem("PGP PRIVATE KEY BLOCK", "pgp", 8), "\n"),
    (
        "PuTTY private key",
        "",
        "PuTTY-User-Key-File-3: ssh-ed25519\nEncryption: none\nComment: deploy\nPublic-Lines: 2\n"
        + b64("ppk-pub", 48)
        + "\nPrivate-Lines: 1\n"
        + b64("ppk", 32)
        + "\nPrivate-MAC: "
        + tok("ppk-mac", HEX, 64),
        "\n",
    ),
    (
        ".netrc password",
        "machine api.acme.internal\n  login deploy\n  password ",
        tok("netrc", ALNUM, 20),
        "\n",
    ),
    (
        "Docker auth value",
        '{"auths": {"registry.acme.internal": {"auth": "',
        base64.b64encode(f"ci:{tok('docker', ALNUM, 20)}".encode()).decode(),
        '"}}}',
    ),
    ("Hugging Face org token", "HF_TOKEN=", "api_org_" + tok("hforg", ALNUM, 34), "\n"),
]
"""The formats issue 53 found missed, each of our own making, kept out of the coverage set."""


LOOK_ALIKES: list[tuple[str, str]] = [
    ("UUID", "request 550e8400-e29b-41d4-a716-446655440000 failed with 502"),
    ("git SHA", "fixed in commit " + hashlib.sha1(b"commit").hexdigest() + " on main"),
    ("short git SHAs", "see 3f2a9c1 and a1b2c3d for the revert"),
    ("SHA-256", "sha256sum: " + hashlib.sha256(b"file").hexdigest() + "  app.tar.gz"),
    ("SHA-512", "checksum " + hashlib.sha512(b"file").hexdigest()),
    ("image digest", "image: ghcr.io/acme/app@sha256:" + hashlib.sha256(b"image").hexdigest()),
    ("MD5", "ETag md5 " + hashlib.md5(b"etag").hexdigest()),
    ("data URI", '<img src="data:image/png;base64,' + b64("png", 300) + '">'),
    ("ULID", "event 01HZXW3KQ8G8N2M6T5Y4R3P2Q1 arrived late"),
    ("AWS ARN", "assume arn:aws:iam::123456789012:role/ci-deploy then retry"),
    ("pod name", "pod checkout-7d4b9c8f6d-x2x9z was OOMKilled"),
    ("URL without credentials", "see https://docs.example.com/api/v2/auth?lang=en&page=3#tokens"),
    ("hex colours", "palette #ff00ff #00ff00 #1e90ff"),
    ("file path", "/home/runner/.cache/huggingface/hub/models--acme--base/snapshots/main"),
    ("traceback", 'File "/srv/app/handlers/refund.py", line 42, in handle_refund_request'),
    ("version and datetime", "v2.14.1 released 2026-01-02T03:04:05.123456Z"),
    ("GitHub Actions secret reference", "env:\n  GH_TOKEN: ${{ secrets.GITHUB_TOKEN }}"),
    ("environment lookup", 'api_key = os.environ["OPENAI_API_KEY"]'),
    ("Node environment lookup", "const key = process.env.STRIPE_SECRET_KEY;"),
    ("masked password", 'password: "********"'),
    ("template token", "token: <your-token-here>"),
    ("None key", "api_key=None  # set it later"),
    (
        "SSH public key",
        "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAI" + tok("sshpub", B64, 43) + " ci@acme",
    ),
    ("public key block", pem("PUBLIC KEY", "pub", 4)),
    ("certificate", pem("CERTIFICATE", "cert", 10)),
    ("traceparent", "traceparent: 00-" + tok("tp1", HEX, 32) + "-" + tok("tp2", HEX, 16) + "-01"),
    ("pip hash", "requests==2.32.3 --hash=sha256:" + hashlib.sha256(b"wheel").hexdigest()),
    ("Stripe object ids", "charge ch_3MtwBwLkdIwHu7ix28a3tqPa for cus_NffrFeUfNV2Hib"),
    ("Stripe publishable key", "Stripe('pk_live_51" + tok("pk", ALNUM, 40) + "')"),
    ("placeholder OpenAI key", "OPENAI_API_KEY=sk-xxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxx"),
    ("placeholder GitHub token", "GITHUB_TOKEN=ghp_XXXXXXXXXXXXXXXXXXXXXXXXXXXXXXXXXXXX"),
    ("npm integrity", '"integrity": "sha512-' + b64("npm-int", 64) + '"'),
    ("image tag", "docker pull registry.example.com/team/app:1.4.2"),
    ("bearer variable", 'curl -H "Authorization: Bearer $TOKEN" https://api.example.com/v1/me'),
    ("analytics ids", "gtag('config', 'G-4X7Q2ZK9PL'); ga('create', 'UA-12345678-1')"),
]
"""Text that looks like a credential and is none: it must come out byte for byte."""


PROSE: list[str] = [
    "Set token_limit = 4096 and retry the request.",
    "Your password: must be at least 12 characters long.",
    "The secret: keep retries low and back off exponentially.",
    "The key: press Enter to continue, or Esc to cancel.",
    "A password reset link was sent; the token expires in 15 minutes.",
    "Never share your secret key with anyone, not even with support.",
    "The API key is stored in the vault; ask the admin for access.",
    "Token count: 1532 prompt, 210 completion.",
    "key = value pairs are separated by semicolons in this format.",
    "password = input('Password: ') reads it from the terminal without echo.",
    "My secret: I never read the manual before calling support.",
    "Use the --password flag only in scripts you trust.",
    "The token: an opaque string that the server hands out after login.",
    "Keys: the primary key is trace_id and the sort key is revision.",
    "She forgot her password again, so we reset it twice this week.",
    "Secrets management is hard; rotate keys every 90 days.",
    "max_tokens = 512 keeps the answers short.",
    "The access token has the scope read:org and expires at 2026-01-02T03:04:05Z.",
    "password: optional (leave it blank to sign in with SSO)",
    "auth = basic means the proxy checks a user name and nothing else.",
    "Bearer tokens are sent in the Authorization header of each request.",
    "Key: value pairs in the YAML you pasted look fine to me.",
    "secret_santa = true for the holiday party this year.",
    "The signing key rotated at 09:00 UTC; there is nothing to do.",
]
"""Sentences that use password, secret, token and key as words: none may change."""


PIECE = 6  # a run this long of the credential left in the output is a tail
_SEPARATORS = set(" \t\n\"'`=:;&?,/@()[]{}<>|")


def replaced_whole(out: str, before: str, secret: str, after: str) -> bool:
    """Whether the redacted text ``out`` holds a placeholder and no run of :data:`PIECE`
    characters of the credential (runs that its context holds aside)."""
    context = before + after
    pieces = {secret[i : i + PIECE] for i in range(len(secret) - PIECE + 1)}
    rest = re.sub(r"\[REDACTED:[A-Z_]+\]", "\0", out)  # a placeholder is no piece of it
    return rest != out and not any(p in rest for p in pieces if p not in context)


def context_kept(out: str, before: str, after: str) -> bool:
    """Whether the text around the credential is kept: ``out`` starts with ``before`` up to
    its last separator and ends with ``after`` from its first (a name, a quote, an ``=``,
    the rest of a connection string or a sentence)."""
    head = max((i + 1 for i, c in enumerate(before) if c in _SEPARATORS), default=0)
    tail = min((i for i, c in enumerate(after) if c in _SEPARATORS), default=len(after))
    return out.startswith(before[:head]) and out.endswith(after[tail:])


Redact = Callable[[str], str]


def measure(redact: Redact, cases: list[Case] = CREDENTIALS) -> dict[str, list[str]]:
    """What ``redact`` does to the set: the credentials not replaced whole, those whose
    context it changed, the look-alikes and the sentences it changed."""
    missed, spilled = [], []
    for name, before, secret, after in cases:
        out = redact(before + secret + after)
        if not replaced_whole(out, before, secret, after):
            missed.append(name)
        elif not context_kept(out, before, after):
            spilled.append(name)
    return {
        "missed": missed,
        "context_changed": spilled,
        "look_alikes_changed": [name for name, text in LOOK_ALIKES if redact(text) != text],
        "prose_changed": [text for text in PROSE if redact(text) != text],
    }


def formats(cases: list[Case] = CREDENTIALS) -> int:
    """How many formats a list of cases holds."""
    return len({name for name, *_ in cases})


if __name__ == "__main__":
    from rl_export.privacy.redact import redactor

    scrub = redactor(("secrets",))

    def redact(text: str) -> str:
        return scrub.text(text)[0]

    for label, cases in (("coverage set", CREDENTIALS), ("issue 53's formats", REPORTED)):
        result = measure(redact, cases)
        found = len(cases) - len(result["missed"])
        share = 100 * found / len(cases)
        print(f"{label}: {found}/{len(cases)} replaced whole ({share:.1f} %); missed "
              f"{result['missed']}; context changed {result['context_changed']}")  # fmt: skip
    result = measure(redact)
    print(f"look-alikes changed: {len(result['look_alikes_changed'])}/{len(LOOK_ALIKES)} "
          f"{result['look_alikes_changed']}")  # fmt: skip
    print(
        f"sentences changed: {len(result['prose_changed'])}/{len(PROSE)} {result['prose_changed']}"
    )
