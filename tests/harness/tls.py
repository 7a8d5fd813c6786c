"""A certificate authority, a broker certificate and client certificates made for one test
session (PEM files).

The broker's key store holds its unencrypted PKCS#8 key and its certificate (for 127.0.0.1
and localhost); the trust store is the CA certificate, which the clients are given too. For
mutual TLS, one client key with certificates that a broker must accept (signed by the CA) or
refuse (expired; signed by an unrelated CA), and the same key encrypted with a password.
"""

from __future__ import annotations

import datetime
import ipaddress
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

CLIENT_NAME = "rl-export-client"  # the client certificates' common name
CLIENT_PRINCIPAL = f"User:CN={CLIENT_NAME}"  # what the broker calls a client that shows one
KEY_PASSWORD = "key-password-for-the-test"  # of the encrypted copy of the client key


@dataclass(frozen=True)
class TlsFiles:
    ca: Path  # the CA certificate (clients' RL_EXPORT_KAFKA_SSL_CA_FILE, broker trust store)
    keystore: Path  # the broker's key and certificate
    other_ca: Path  # a CA that signed only a stranger's certificate: a client trusting it fails
    client_key: Path  # the client's key (unencrypted PKCS#8)
    client_key_encrypted: Path  # the same key, encrypted with KEY_PASSWORD
    client_cert: Path  # signed by the CA, valid: the broker accepts it
    expired_cert: Path  # signed by the CA, expired an hour ago
    stranger_cert: Path  # signed by the unrelated CA


def _name(common: str) -> x509.Name:
    return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common)])


def _ca(common: str) -> tuple[ec.EllipticCurvePrivateKey, x509.Certificate]:
    key = ec.generate_private_key(ec.SECP256R1())
    now = datetime.datetime.now(datetime.UTC)
    cert = (
        x509.CertificateBuilder()
        .subject_name(_name(common))
        .issuer_name(_name(common))
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=2))
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(
            x509.KeyUsage(
                digital_signature=True,
                key_cert_sign=True,
                crl_sign=True,
                content_commitment=False,
                key_encipherment=False,
                data_encipherment=False,
                key_agreement=False,
                encipher_only=False,
                decipher_only=False,
            ),
            critical=True,
        )
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False)
        .sign(key, hashes.SHA256())
    )
    return key, cert


def _pem(cert: x509.Certificate) -> bytes:
    return cert.public_bytes(serialization.Encoding.PEM)


def _client(
    key: ec.EllipticCurvePrivateKey, issuer: tuple[ec.EllipticCurvePrivateKey, x509.Certificate],
    *, expired: bool = False,
) -> x509.Certificate:  # fmt: skip
    now = datetime.datetime.now(datetime.UTC)
    start, end = now - datetime.timedelta(minutes=5), now + datetime.timedelta(days=2)
    if expired:
        start, end = now - datetime.timedelta(days=2), now - datetime.timedelta(hours=1)
    return (
        x509.CertificateBuilder()
        .subject_name(_name(CLIENT_NAME))
        .issuer_name(issuer[1].subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(start)
        .not_valid_after(end)
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(
            x509.ExtendedKeyUsage([x509.oid.ExtendedKeyUsageOID.CLIENT_AUTH]), critical=False
        )
        .add_extension(
            x509.AuthorityKeyIdentifier.from_issuer_public_key(issuer[0].public_key()),
            critical=False,
        )
        .sign(issuer[0], hashes.SHA256())
    )


def make_tls_files(folder: Path) -> TlsFiles:
    """Write a CA, a broker key store signed by it, an unrelated CA and the client files."""
    folder.mkdir(parents=True, exist_ok=True)
    ca_key, ca_cert = _ca("rl-export test CA")
    other_key, other = _ca("rl-export unrelated CA")
    key = ec.generate_private_key(ec.SECP256R1())
    now = datetime.datetime.now(datetime.UTC)
    broker = (
        x509.CertificateBuilder()
        .subject_name(_name("localhost"))
        .issuer_name(ca_cert.subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=2))
        .add_extension(
            x509.SubjectAlternativeName(
                [x509.DNSName("localhost"), x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]
            ),
            critical=False,
        )
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(
            x509.ExtendedKeyUsage(
                [x509.oid.ExtendedKeyUsageOID.SERVER_AUTH, x509.oid.ExtendedKeyUsageOID.CLIENT_AUTH]
            ),
            critical=False,
        )
        .add_extension(
            x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key()),
            critical=False,
        )
        .sign(ca_key, hashes.SHA256())
    )
    files = TlsFiles(
        folder / "ca.pem", folder / "broker.pem", folder / "other-ca.pem",
        folder / "client-key.pem", folder / "client-key-encrypted.pem", folder / "client.pem",
        folder / "client-expired.pem", folder / "client-stranger.pem",
    )  # fmt: skip
    client = ec.generate_private_key(ec.SECP256R1())
    for path, encryption in (
        (files.client_key, serialization.NoEncryption()),
        (files.client_key_encrypted,
         serialization.BestAvailableEncryption(KEY_PASSWORD.encode())),
    ):  # fmt: skip
        path.write_bytes(client.private_bytes(
            serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, encryption))  # fmt: skip
    files.client_cert.write_bytes(_pem(_client(client, (ca_key, ca_cert))))
    files.expired_cert.write_bytes(_pem(_client(client, (ca_key, ca_cert), expired=True)))
    files.stranger_cert.write_bytes(_pem(_client(client, (other_key, other))))
    files.ca.write_bytes(_pem(ca_cert))
    files.other_ca.write_bytes(_pem(other))
    private = key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    )
    files.keystore.write_bytes(private + _pem(broker))
    return files
