"""Fixtures for the anyio transport tests: both backends, embedded brokers, a test CA."""

from __future__ import annotations

import datetime
import ipaddress
import json
import urllib.request
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import anyio
import pytest

from transports.embedded import EmbeddedNSQD, ServerThread
from transports.pytest_plugin import nsq_cluster, nsqd, nsqlookupd  # noqa: F401


@pytest.fixture(params=["asyncio", "trio"])
def anyio_backend(request: pytest.FixtureRequest) -> str:
    return str(request.param)


NSQDFactory = Callable[..., EmbeddedNSQD]
_THREADS: dict[int, ServerThread[EmbeddedNSQD]] = {}


@pytest.fixture
def make_nsqd() -> Iterator[NSQDFactory]:
    """Start extra embedded nsqds with options; ``stop(server)`` kills one early."""
    threads: list[ServerThread[EmbeddedNSQD]] = []

    def start(**options: Any) -> EmbeddedNSQD:
        # built right here, possibly inside the test's own (trio) loop: EmbeddedNSQD makes its
        # anyio objects in start(), on the server thread's loop
        thread = ServerThread(EmbeddedNSQD(**options))
        server = thread.start()
        threads.append(thread)
        _THREADS[id(server)] = thread
        return server

    yield start
    for thread in reversed(threads):
        thread.stop()


def stop_nsqd(server: EmbeddedNSQD) -> None:
    _THREADS.pop(id(server)).stop()


@dataclass(frozen=True)
class CA:
    ca_file: str
    cert_file: str
    key_file: str


@pytest.fixture(scope="session")
def test_ca(tmp_path_factory: pytest.TempPathFactory) -> CA:
    """A private CA and a server certificate it signed for 127.0.0.1 / localhost."""
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    now = datetime.datetime.now(datetime.timezone.utc)
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
    key = ec.generate_private_key(ec.SECP256R1())
    cert = (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "localhost")]))
        .issuer_name(ca_name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(days=1))
        .not_valid_after(now + datetime.timedelta(days=2))
        .add_extension(
            x509.SubjectAlternativeName(
                [x509.DNSName("localhost"), x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]
            ),
            critical=False,
        )
        .add_extension(
            x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key()),
            critical=False,
        )
        .add_extension(
            x509.ExtendedKeyUsage([x509.oid.ExtendedKeyUsageOID.SERVER_AUTH]), critical=False
        )
        .sign(ca_key, hashes.SHA256())
    )
    directory = tmp_path_factory.mktemp("ca")
    paths = directory / "ca.pem", directory / "server.pem", directory / "server.key"
    paths[0].write_bytes(ca_cert.public_bytes(serialization.Encoding.PEM))
    paths[1].write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    paths[2].write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
    )
    return CA(str(paths[0]), str(paths[1]), str(paths[2]))


def _get_json(url: str) -> Any:
    with urllib.request.urlopen(url, timeout=5) as response:
        return json.loads(response.read())


async def channel_stats(server: EmbeddedNSQD, topic: str, channel: str) -> dict[str, Any]:
    """The broker's own view of a channel (``/stats?format=json``), {} when it does not exist."""
    url = f"{server.http_url}/stats?format=json&topic={topic}&channel={channel}"
    stats = await anyio.to_thread.run_sync(_get_json, url)
    for t in stats.get("topics") or []:  # null when nsqd has no such topic
        if t["topic_name"] == topic:
            for c in t.get("channels", []):
                if c["channel_name"] == channel:
                    return dict(c)
    return {}


async def wait_channel(
    server: EmbeddedNSQD,
    topic: str,
    channel: str,
    check: Callable[[dict[str, Any]], bool],
    *,
    timeout: float = 10.0,
    what: str = "",
) -> dict[str, Any]:
    """Poll the broker's view of a channel until ``check(stats)`` holds; returns those stats.

    A client's FIN/REQ/RDY is applied by the broker a little after the client queued it (on
    another thread, later still under load): read broker state through this, never once
    right after an action. A ``check`` that raises KeyError/IndexError counts as not yet."""
    last: dict[str, Any] = {}
    with anyio.move_on_after(timeout):
        while True:
            last = await channel_stats(server, topic, channel)
            try:
                if check(last):
                    return last
            except (KeyError, IndexError):
                pass
            await anyio.sleep(0.02)
    raise AssertionError(f"broker state not reached in {timeout}s ({what or check}): {last}")


async def lookup_producers(lookupd_http_url: str, topic: str) -> list[Any]:
    """``/lookup?topic=`` producers (an unknown topic gives [])."""
    try:
        answer = await anyio.to_thread.run_sync(
            _get_json, f"{lookupd_http_url}/lookup?topic={topic}"
        )
    except OSError:
        return []
    return list(answer.get("producers", []))
