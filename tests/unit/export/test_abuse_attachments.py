"""The SSRF matrix of DESIGN.md section 10: attachment URIs from untrusted events that an
export must refuse, and the allowed path (fetched, text redacted, size caps, missing).

The allowed source is a TLS server on loopback standing in for a public host: the test
injects a resolver (the host resolves to a public address, so the address check passes on
it), a dialler (that address is dialled on loopback) and the server's CA. Nothing else of
the production checks is changed."""

from __future__ import annotations

import json
import ssl
import zipfile
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest
import trustme
from aiohttp import web

from rl_export.corpora.layout import CorpusRef
from rl_export.corpora.store import LocalStore, MemoryStore, S3Store
from rl_export.export import write_export
from rl_export.export.attachments import AttachmentPolicy, Fetcher
from rl_export.model.errors import ConfigError
from rl_export.privacy.attachment_sources import NotAllowed, is_public, normalise, parse_sources
from rl_export.runtime.settings import load_settings
from tests.exportdata import ORG, PROJECT, replay_events
from tests.records import trace_events

HOST = "files.example.com"
PUBLIC = "93.184.215.14"  # what HOST "resolves" to: a public address


@dataclass
class Servers:
    https_port: int
    plain_port: int
    ca: trustme.CA
    hits: list[str] = field(default_factory=list)  # paths the loopback-only server served

    @property
    def base(self) -> str:
        return f"https://{HOST}:{self.https_port}"

    def fetcher(self, store: object = None, **policy: object) -> Fetcher:
        context = ssl.create_default_context()
        self.ca.configure_trust(context)
        sources = parse_sources(f"{self.base}/allowed/")

        async def resolve(host: str, port: int) -> list[str]:
            return {HOST: [PUBLIC], "localhost": ["127.0.0.1", "::1"]}.get(host, ["10.0.0.7"])

        return Fetcher(
            store if store is not None else MemoryStore(),  # type: ignore[arg-type]  # test double
            AttachmentPolicy(sources=sources, **policy),  # type: ignore[arg-type]  # test values
            resolve=resolve, dial=lambda a: "127.0.0.1" if a == PUBLIC else a,
            ssl_context=context,
        )  # fmt: skip


SECRET_TEXT = b"db password: postgres://admin:hunter2secret@db.internal:5432/app\n"


@pytest.fixture
async def servers() -> AsyncIterator[Servers]:
    ca = trustme.CA()
    cert = ca.issue_cert(HOST)
    server_context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    cert.configure_cert(server_context)
    hits: list[str] = []

    async def notes(_: web.Request) -> web.Response:
        return web.Response(body=SECRET_TEXT, content_type="text/plain")

    async def image(_: web.Request) -> web.Response:
        return web.Response(body=b"\x89PNG" + b"\0" * 60, content_type="image/png")

    async def big(_: web.Request) -> web.StreamResponse:
        return web.Response(body=b"x" * 5000)

    plain = web.Application()

    async def metrics(request: web.Request) -> web.Response:
        hits.append(request.path)
        return web.Response(text="rl_export_secret_metric 1\n")

    plain.router.add_get("/{tail:.*}", metrics)
    plain_runner = web.AppRunner(plain)
    await plain_runner.setup()
    plain_site = web.TCPSite(plain_runner, "127.0.0.1", 0)
    await plain_site.start()
    plain_port = plain_site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]  # aiohttp keeps it private

    async def redirect(_: web.Request) -> web.Response:
        raise web.HTTPFound(f"http://127.0.0.1:{plain_port}/metrics")

    app = web.Application()
    app.router.add_get("/allowed/notes.txt", notes)
    app.router.add_get("/allowed/image.png", image)
    app.router.add_get("/allowed/big.bin", big)
    app.router.add_get("/allowed/redirect", redirect)
    app.router.add_get("/secret/notes.txt", notes)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0, ssl_context=server_context)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]  # aiohttp keeps it private
    try:
        yield Servers(port, plain_port, ca, hits)
    finally:
        await runner.cleanup()
        await plain_runner.cleanup()


# --- refused --------------------------------------------------------------------------------


async def test_the_ssrf_matrix_is_refused_without_touching_the_target(
    servers: Servers, tmp_path: Path
) -> None:
    secret_file = tmp_path / "store" / "other-org" / "p" / "human" / "data" / "x.jsonl"
    secret_file.parent.mkdir(parents=True)
    secret_file.write_text('{"secret": "other org"}\n')
    p, b = servers.plain_port, servers.base
    refused = {
        "file": secret_file.as_uri(),
        "proc": "file:///proc/self/environ",
        "loopback by IP": f"https://127.0.0.1:{servers.https_port}/allowed/notes.txt",
        "loopback metrics over http": f"http://127.0.0.1:{p}/metrics",
        "localhost": f"https://localhost:{servers.https_port}/allowed/notes.txt",
        "IPv6 loopback": f"https://[::1]:{servers.https_port}/allowed/notes.txt",
        "metadata": "https://169.254.169.254/latest/meta-data/iam/",
        "metadata IPv6": "https://[fd00:ec2::254]/latest/meta-data/",
        "private 10/8": "https://10.1.2.3/allowed/x",
        "private 192.168/16": "https://192.168.0.1/allowed/x",
        "IPv4-mapped loopback": "https://[::ffff:127.0.0.1]/allowed/x",
        "IPv4-mapped metadata": "https://[::ffff:a9fe:a9fe]/allowed/x",
        "host resolving to a private address": "https://internal.example.com/allowed/x",
        "plain http to the allowed host": f"http://{HOST}:{servers.https_port}/allowed/x",
        "userinfo": f"https://{HOST}:{servers.https_port}@127.0.0.1:{p}/allowed/x",
        "userinfo before the allowed host": f"https://evil@{HOST}:{servers.https_port}/allowed/x",
        "dot-dot": f"{b}/allowed/../secret/notes.txt",
        "encoded dot-dot": f"{b}/allowed/%2e%2e/secret/notes.txt",
        "double-encoded dot-dot": f"{b}/allowed/%252e%252e/secret/notes.txt",
        "backslash": f"{b}/allowed\\..\\secret/notes.txt",
        "prefix confusion": f"{b}/allowed-not/notes.txt",
        "prefix confusion by host": f"https://{HOST}.evil.test:{servers.https_port}/allowed/x",
        "other port": f"https://{HOST}:{p}/allowed/notes.txt",
        "ftp": "ftp://files.example.com/allowed/x",
        "gopher": f"gopher://127.0.0.1:{p}/_x",
        "not a string": 42,
    }
    fetcher = servers.fetcher()
    for case, uri in refused.items():
        assert await fetcher.fetch(uri) == ("not_allowed", None), case
    assert servers.hits == []  # the loopback server was never reached


async def test_a_redirect_to_loopback_is_not_followed(servers: Servers) -> None:
    fetcher = servers.fetcher()
    assert await fetcher.fetch(f"{servers.base}/allowed/redirect") == ("failed", None)
    assert servers.hits == []


async def test_the_stores_own_prefix_and_another_orgs_shard_are_refused() -> None:
    # Even when an operator allows the whole bucket, the store's own prefix stays closed.
    store = S3Store("corpora", "prod")
    fetcher = Fetcher(store, AttachmentPolicy(sources=parse_sources("s3://corpora/")))
    try:
        for uri in (
            "s3://corpora/prod/other-org/p/human/data/trajectories-0/0000-ab.jsonl",
            "s3://corpora/prod/_tokens/0123456789ab.json",
            "s3://CORPORA/prod/acme/support/human/data/x.jsonl",
            "s3://corpora/x/../prod/acme/support/human/data/x.jsonl",
            "s3://corpora//prod/acme/x.jsonl",
        ):
            assert await fetcher.fetch(uri) == ("not_allowed", None), uri
        # A bucket nobody allowed.
        other = Fetcher(store, AttachmentPolicy(sources=parse_sources("s3://uploads/a/")))
        assert await other.fetch("s3://uploads/b/x.png") == ("not_allowed", None)
        assert other.check("s3://uploads/a/x.png").key == "a/x.png"
    finally:
        await store.close()


async def test_nothing_is_fetched_by_default(servers: Servers, tmp_path: Path) -> None:
    fetcher = Fetcher(MemoryStore())
    assert await fetcher.fetch(f"{servers.base}/allowed/notes.txt") == ("not_allowed", None)
    assert await fetcher.fetch((tmp_path / "x").as_uri()) == ("not_allowed", None)


def test_addresses() -> None:
    for address in (
        "127.0.0.1", "::1", "10.0.0.1", "172.16.5.4", "192.168.1.1", "169.254.169.254",
        "fd00:ec2::254", "100.64.0.1", "0.0.0.0", "::", "224.0.0.1", "ff02::1", "240.0.0.1",
        "255.255.255.255", "::ffff:127.0.0.1", "::ffff:10.0.0.1", "2002:7f00:1::",
        "2002:a9fe:a9fe::", "64:ff9b::7f00:1", "64:ff9b:1::1",
        "2001:0:4136:e378:8000:63bf:3fff:fdd2", "fe80::1", "fec0::1", "192.0.2.1", "not an address",
    ):  # fmt: skip
        assert not is_public(address), address
    for address in ("93.184.215.14", "8.8.8.8", "2606:4700::1111", "::ffff:8.8.8.8",
                    "2002:0808:0808::", "64:ff9b::808:808"):  # fmt: skip
        assert is_public(address), address


def test_normalise_and_sources() -> None:
    target = normalise("HTTPS://Files.Example.COM./allowed/a/./b/../c%20d.txt?sig=1")
    assert target.url == "https://files.example.com/allowed/a/c%20d.txt?sig=1"
    for bad in ("https://h/%2e%2e/%2e%2e/x", "https://h/a/%25%32%65", "https://h/a/%00"):
        with pytest.raises(NotAllowed):
            normalise(bad)
    for bad in ("https://h/no-slash", "http://h/a/", "file:///tmp/", "https://u@h/a/"):
        with pytest.raises(ValueError, match="'"):
            parse_sources(bad)
    assert [str(s) for s in parse_sources(" s3://b-1/p/ , https://H:8443/x/ ")] == [
        "s3://b-1/p/", "https://h:8443/x/",
    ]  # fmt: skip


# --- allowed --------------------------------------------------------------------------------


async def test_an_allowed_source_is_fetched_and_capped(servers: Servers) -> None:
    fetcher = servers.fetcher(max_bytes=4096, max_total_bytes=len(SECRET_TEXT) + 10)
    assert await fetcher.fetch(f"{servers.base}/allowed/notes.txt") == ("fetched", SECRET_TEXT)
    assert await fetcher.fetch(f"{servers.base}/allowed/big.bin") == ("too_large", None)
    assert await fetcher.fetch(f"{servers.base}/allowed/gone.txt") == ("missing", None)
    # The total per export: what is left after notes.txt is less than the image.
    assert await fetcher.fetch(f"{servers.base}/allowed/image.png") == ("too_large", None)
    # The certificate is checked against the host name: another name is a failure.
    wrong = servers.fetcher()
    other = f"https://other.example.com:{servers.https_port}/"
    wrong.policy = AttachmentPolicy(sources=parse_sources(other))

    async def resolve(host: str, port: int) -> list[str]:
        return [PUBLIC]

    wrong.resolve = resolve
    uri = f"{other}allowed/notes.txt"
    assert await wrong.fetch(uri) == ("failed", None)


async def test_a_zip_export_redacts_text_attachments_and_lists_every_status(
    servers: Servers, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = LocalStore(tmp_path / "store")
    b = servers.base
    attachments = [
        {"name": name, "uri": uri, "content_type": kind, "size": 1}
        for name, uri, kind in (
            ("notes.txt", f"{b}/allowed/notes.txt", "text/plain"),
            ("image.png", f"{b}/allowed/image.png", "image/png"),
            ("gone.txt", f"{b}/allowed/gone.txt", "text/plain"),
            ("big.bin", f"{b}/allowed/big.bin", "application/octet-stream"),
            ("metrics", f"http://127.0.0.1:{servers.plain_port}/metrics", "text/plain"),
            ("shard", (tmp_path / "store").as_uri() + "/x", "application/json"),
            ("redirect", f"{b}/allowed/redirect", "text/plain"),
        )
    ]
    await replay_events(store, trace_events(1, score=0.9, passed=True, attachments=attachments),
                        "abuse")  # fmt: skip
    fetcher = servers.fetcher(max_bytes=4096)
    out = tmp_path / "out.zip"
    from rl_export.export import writers

    # The zip writer makes its fetcher: hand it the one with the test's resolver and CA.
    monkeypatch.setattr(writers, "Fetcher", lambda store, policy: fetcher)
    summary = await write_export(store, CorpusRef(ORG, PROJECT, "evaluator"), format="zip",
                                 out=out, columns="trace_id,attachments")  # fmt: skip
    assert (summary.attachments, summary.attachment_errors) == (2, 5)
    assert summary.redactions["secrets"] >= 1
    assert summary.redactions["unscanned"] == 1
    with zipfile.ZipFile(out) as archive:
        notes = archive.read("files/tr-001/notes.txt")
        assert b"hunter2secret" not in notes
        assert b"[REDACTED:SECRETS]" in notes
        assert archive.read("files/tr-001/image.png").startswith(b"\x89PNG")
        assert "files/errors.json" not in archive.namelist()
        manifest = json.loads(archive.read("files/manifest.json"))
    assert [(m["name"], m["status"]) for m in manifest] == [
        ("notes.txt", "fetched"), ("image.png", "fetched"), ("gone.txt", "missing"),
        ("big.bin", "too_large"), ("metrics", "not_allowed"), ("shard", "not_allowed"),
        ("redirect", "failed"),
    ]  # fmt: skip
    text = json.dumps(manifest)
    for detail in ("127.0.0.1", str(tmp_path), HOST, "allowed/"):
        assert detail not in text
    assert servers.hits == []


def test_a_bad_source_setting_is_refused_naming_it() -> None:
    for bad in ("http://files.example.com/a/", "file:///var/", "https://u@h/a/", "s3://b/a"):
        with pytest.raises(ConfigError) as caught:
            load_settings(attachment_sources=bad)
        assert caught.value.setting == "RL_EXPORT_ATTACHMENT_SOURCES"
    settings = load_settings(attachment_sources="s3://uploads/a/, https://Files.Example.com/x/")
    policy = AttachmentPolicy.from_settings(settings)
    assert [str(s) for s in policy.sources] == ["s3://uploads/a/", "https://files.example.com/x/"]
    assert (policy.max_bytes, policy.max_total_bytes) == (16 << 20, 256 << 20)
    assert load_settings().attachment_prefixes == ()  # nothing is fetched by default
