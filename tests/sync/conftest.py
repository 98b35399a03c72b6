"""Fixtures for the blocking transport's integration tests: embedded brokers on background
threads, over real loopback sockets (no mocks)."""

from __future__ import annotations

import datetime
import ipaddress
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from transports.embedded import EmbeddedNSQD, ServerThread

from ._helpers import running_nsqd


@pytest.fixture
def nsqd() -> Iterator[tuple[EmbeddedNSQD, ServerThread[EmbeddedNSQD]]]:
    with running_nsqd() as pair:
        yield pair


@pytest.fixture(autouse=True)
def no_thread_left_behind() -> Iterator[None]:
    """Every test must leave no thread of ours running (consumer IO, workers, producer IO)."""
    yield
    deadline = time.monotonic() + 5.0
    while True:
        ours = [
            t for t in threading.enumerate() if t.name.startswith(("nsq-sync-",)) and t.is_alive()
        ]
        if not ours or time.monotonic() > deadline:
            break
        time.sleep(0.02)
    assert not ours, f"threads left behind: {ours}"


@pytest.fixture(scope="session")
def test_ca(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    """A private CA and a server certificate it signed for 127.0.0.1 / localhost, plus a
    client certificate; returns PEM file paths (ca, cert, key, client_cert, client_key)."""
    pytest.importorskip("cryptography")
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    now = datetime.datetime.now(datetime.timezone.utc)
    directory: Path = tmp_path_factory.mktemp("ca")

    def write_key(key: ec.EllipticCurvePrivateKey, name: str) -> str:
        path = directory / name
        path.write_bytes(
            key.private_bytes(
                serialization.Encoding.PEM,
                serialization.PrivateFormat.PKCS8,
                serialization.NoEncryption(),
            )
        )
        return str(path)

    def write_cert(cert: x509.Certificate, name: str) -> str:
        path = directory / name
        path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
        return str(path)

    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "nsq-sansio test CA")])
    ca_cert = (
        x509.CertificateBuilder()
        .subject_name(ca_name)
        .issuer_name(ca_name)
        .public_key(ca_key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(days=1))
        .not_valid_after(now + datetime.timedelta(days=2))
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .add_extension(
            x509.KeyUsage(
                digital_signature=True,
                content_commitment=False,
                key_encipherment=False,
                data_encipherment=False,
                key_agreement=False,
                key_cert_sign=True,
                crl_sign=True,
                encipher_only=False,
                decipher_only=False,
            ),
            critical=True,
        )
        .add_extension(
            x509.SubjectKeyIdentifier.from_public_key(ca_key.public_key()), critical=False
        )
        .sign(ca_key, hashes.SHA256())
    )

    def leaf(common_name: str, server: bool) -> tuple[x509.Certificate, ec.EllipticCurvePrivateKey]:
        key = ec.generate_private_key(ec.SECP256R1())
        builder = (
            x509.CertificateBuilder()
            .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)]))
            .issuer_name(ca_name)
            .public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(days=1))
            .not_valid_after(now + datetime.timedelta(days=1))
            .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
            .add_extension(
                x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key()),
                critical=False,
            )
        )
        if server:
            builder = builder.add_extension(
                x509.SubjectAlternativeName(
                    [
                        x509.IPAddress(ipaddress.ip_address("127.0.0.1")),
                        x509.DNSName("localhost"),
                        x509.DNSName("nsqd.test"),
                    ]
                ),
                critical=False,
            ).add_extension(
                x509.ExtendedKeyUsage([x509.oid.ExtendedKeyUsageOID.SERVER_AUTH]), critical=False
            )
        else:
            builder = builder.add_extension(
                x509.ExtendedKeyUsage([x509.oid.ExtendedKeyUsageOID.CLIENT_AUTH]), critical=False
            )
        return builder.sign(ca_key, hashes.SHA256()), key

    server_cert, server_key = leaf("127.0.0.1", server=True)
    client_cert, client_key = leaf("nsq-sansio client", server=False)
    return {
        "ca": write_cert(ca_cert, "ca.pem"),
        "cert": write_cert(server_cert, "server.pem"),
        "key": write_key(server_key, "server.key"),
        "client_cert": write_cert(client_cert, "client.pem"),
        "client_key": write_key(client_key, "client.key"),
    }
