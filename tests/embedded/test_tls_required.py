"""nsqd's ``--tls-required`` modes, the embedded broker beside the real nsqd (when its binaries
are there): ``true`` closes the plain HTTP API too, ``tcp-https`` requires TLS of TCP clients
only (found comparing the two: the embedded one knew only true/false)."""

from __future__ import annotations

import subprocess
import urllib.error
from collections.abc import Iterator
from contextlib import contextmanager

import pytest
from conformance.wire import RawConn, http_request

from transports.cli.servers import _nsqd_parser
from transports.embedded import EmbeddedNSQD, ServerThread
from transports.testing.real_nsq import (
    MISSING_BINARIES,
    RealNSQD,
    find_binaries,
    nsqd_flags,
)
from transports.testing.tls import self_signed_certificate


@pytest.fixture(scope="module")
def certificate() -> Iterator[tuple[str, str]]:
    try:
        with self_signed_certificate() as files:
            yield files
    except (OSError, subprocess.CalledProcessError):
        pytest.skip("neither the cryptography package nor an openssl binary is available")


@contextmanager
def broker(kind: str, mode: str, cert: str, key: str) -> Iterator[tuple[str, str]]:
    if kind == "embedded":
        with ServerThread(EmbeddedNSQD(tls_cert=cert, tls_key=key, tls_required=mode)) as nsqd:
            yield nsqd.tcp_address, nsqd.http_address
        return
    if find_binaries() is None:
        pytest.skip(MISSING_BINARIES)
    flags, _ = nsqd_flags(tls_cert=cert, tls_key=key, tls_required=mode)
    with RealNSQD(flags) as real:
        yield real.tcp_address, real.http_address


@pytest.mark.parametrize("kind", ["embedded", "real"])
def test_tcp_https_requires_tls_of_tcp_clients_only(
    certificate: tuple[str, str], kind: str
) -> None:
    with broker(kind, "tcp-https", *certificate) as (tcp, http):
        with RawConn(tcp) as plain:
            plain.pub("t", b"x")
            assert plain.expect_error("E_INVALID").endswith(b"(TLS required)")
        assert http_request(http, "GET", "/ping")[:2] == (200, b"OK")
        assert http_request(http, "POST", "/pub?topic=t", b"over plain http")[0] == 200


def test_the_cli_takes_nsqds_tls_required_values() -> None:
    parse = _nsqd_parser().parse_args
    assert parse(["--tls-required=tcp-https"]).tls_required == "tcp-https"
    assert parse(["--tls-required"]).tls_required is True
    assert parse(["--tls-required=false"]).tls_required is False
    with pytest.raises(SystemExit):
        parse(["--tls-required=sometimes"])


class _TLSOnlyRealNSQD(RealNSQD):
    """A real nsqd whose plain HTTP port answers 403 TLS_REQUIRED: that answer means it is up."""

    def get(self, path: str, *, timeout: float = 5.0) -> bytes:
        try:
            return super().get(path, timeout=timeout)
        except urllib.error.HTTPError as err:
            if err.code == 403 and path == "/ping":
                return b"OK"
            raise


@contextmanager
def policy_broker(kind: str, cert: str, key: str) -> Iterator[tuple[str, str, int]]:
    """A broker with ``--tls-client-auth-policy=require-verify`` and no ``--tls-required``:
    (TCP address, HTTP address, HTTPS port), each port the broker's own (bound by the embedded
    one, picked again on a clash by RealNSQD)."""
    if kind == "embedded":
        server = EmbeddedNSQD(
            tls_cert=cert,
            tls_key=key,
            tls_client_auth_policy="require-verify",
            tls_root_ca_file=cert,
            https_address="127.0.0.1:0",
        )
        with ServerThread(server) as nsqd:
            yield nsqd.tcp_address, nsqd.http_address, nsqd.https_port
        return
    if find_binaries() is None:
        pytest.skip(MISSING_BINARIES)
    flags = [
        f"--tls-cert={cert}",
        f"--tls-key={key}",
        "--tls-client-auth-policy=require-verify",
        f"--tls-root-ca-file={cert}",
    ]
    with _TLSOnlyRealNSQD(flags) as real:
        yield real.tcp_address, real.http_address, real.https_port


@pytest.mark.parametrize("kind", ["embedded", "real"])
def test_a_client_auth_policy_requires_tls_of_every_client(
    certificate: tuple[str, str], kind: str
) -> None:
    """nsqd turns --tls-required on when a client-auth policy is set: a plaintext TCP client
    is refused every command but IDENTIFY, the plain HTTP API answers 403 to everything (the
    embedded broker used to accept both, certificate or not)."""
    with policy_broker(kind, *certificate) as (tcp, http, https_port):
        with RawConn(tcp) as plain:
            plain.identify()
            plain.pub("t", b"x")
            assert plain.expect_error("E_INVALID") == (
                b"E_INVALID cannot PUB in current state (TLS required)"
            )
            plain.expect_closed()
        for method, path in [("POST", "/pub?topic=t"), ("GET", "/ping"), ("GET", "/stats")]:
            status, body, headers = http_request(http, method, path, b"x")
            assert status == 403, (method, path, status, body)
            assert body == b'{"message": "TLS_REQUIRED", "https_port": %d}' % https_port
            assert headers["content-type"] == "application/json; charset=utf-8"
