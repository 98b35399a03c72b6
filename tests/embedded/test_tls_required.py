"""nsqd's ``--tls-required`` modes, the embedded broker beside the real nsqd (when its binaries
are there): ``true`` closes the plain HTTP API too, ``tcp-https`` requires TLS of TCP clients
only (found comparing the two: the embedded one knew only true/false)."""

from __future__ import annotations

import subprocess
from collections.abc import Iterator
from contextlib import contextmanager

import pytest
from conformance.wire import RawConn, http_request

from transports.demo import self_signed_certificate
from transports.embedded import EmbeddedNSQD, ServerThread
from transports.embedded.cli import _nsqd_parser
from transports.real_nsq import RealNSQD, find_binaries, nsqd_flags


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
        pytest.skip("real NSQ binaries not found")
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
