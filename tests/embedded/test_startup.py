"""Failing to start: one plain exception naming what failed and why, from every way of starting
an embedded server (``async with``, ``Cluster``, ``ServerThread``), never an exception group;
and nsqd's start-up refusals of TLS options that cannot work without a certificate, beside the
real nsqd when its binaries are there."""

from __future__ import annotations

import errno
import os
import socket
import subprocess
from collections.abc import Callable, Iterator
from typing import Any

import anyio
import pytest

from nsq_sansio.errors import ConfigError
from transports.embedded import Cluster, EmbeddedLookupd, EmbeddedNSQD, ServerThread
from transports.embedded.errors import ListenError, TLSFileError
from transports.testing.real_nsq import (
    MISSING_BINARIES,
    RealNSQD,
    find_binaries,
    free_port,
    nsqd_flags,
)
from transports.testing.tls import self_signed_certificate

IN_USE = os.strerror(errno.EADDRINUSE)


@pytest.fixture
def busy() -> Iterator[str]:
    """An address something else listens on."""
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        yield f"127.0.0.1:{taken.getsockname()[1]}"


@pytest.fixture(scope="module")
def certificate() -> Iterator[tuple[str, str]]:
    try:
        with self_signed_certificate() as files:
            yield files
    except (OSError, subprocess.CalledProcessError):
        pytest.skip("neither the cryptography package nor an openssl binary is available")


SERVERS: dict[str, Callable[[str], Any]] = {
    "nsqd tcp_address": lambda busy: EmbeddedNSQD(tcp_address=busy),
    "nsqd http_address": lambda busy: EmbeddedNSQD(http_address=busy),
    "lookupd tcp_address": lambda busy: EmbeddedLookupd(tcp_address=busy),
    "lookupd http_address": lambda busy: EmbeddedLookupd(http_address=busy),
}


def _check_listen_error(error: BaseException, busy: str, option: str) -> None:
    assert type(error) is ListenError, repr(error)  # not an exception group around it
    assert str(error) == f"cannot listen on {busy} ({option}): {IN_USE}"
    assert (error.address, error.option, error.errno) == (busy, option, errno.EADDRINUSE)
    assert isinstance(error, OSError)


@pytest.mark.parametrize("backend", ["asyncio", "trio"])
@pytest.mark.parametrize("server", list(SERVERS))
def test_a_port_in_use_is_one_error_naming_the_address(
    server: str, backend: str, busy: str
) -> None:
    async def start() -> None:
        async with SERVERS[server](busy):
            raise AssertionError("started on an address in use")

    with pytest.raises(BaseException) as raised:
        anyio.run(start, backend=backend)
    _check_listen_error(raised.value, busy, server.split()[1])


@pytest.mark.parametrize("server", list(SERVERS))
def test_a_server_thread_raises_the_same_plain_error(server: str, busy: str) -> None:
    with pytest.raises(BaseException) as raised, ServerThread(SERVERS[server](busy)):
        raise AssertionError("started on an address in use")
    _check_listen_error(raised.value, busy, server.split()[1])


@pytest.mark.parametrize("where", ["lookupd", "second nsqd"])
def test_a_cluster_that_cannot_start_raises_the_one_error_and_stops_the_rest(
    where: str, busy: str
) -> None:
    """The servers already started are stopped, and what their stopping raises (a listener
    closed under its accept) is not wrapped around the cause."""
    if where == "lookupd":
        options: dict[str, Any] = {"lookupd_options": {"http_address": busy}}
    else:  # the first nsqd takes the address; the second one cannot
        busy = f"127.0.0.1:{free_port()}"
        options = {"nsqd_count": 2, "nsqd_options": {"http_address": busy}}

    async def start() -> None:
        async with Cluster(**options):
            raise AssertionError("started on an address in use")

    with pytest.raises(BaseException) as raised:
        anyio.run(start)
    _check_listen_error(raised.value, busy, "http_address")


def test_certificate_files_that_cannot_be_loaded_are_one_error_naming_them(
    tmp_path: Any, certificate: tuple[str, str]
) -> None:
    cert, key = certificate
    missing = str(tmp_path / "missing.pem")
    with pytest.raises(TLSFileError) as raised:
        EmbeddedNSQD(tls_cert=missing, tls_key=key)
    assert str(raised.value) == (
        f"cannot load tls_cert {missing!r} / tls_key {key!r}: {os.strerror(errno.ENOENT)}"
    )
    garbage = tmp_path / "garbage.pem"
    garbage.write_text("not a certificate")
    with pytest.raises(TLSFileError, match=f"cannot load tls_root_ca_file {str(garbage)!r}: "):
        EmbeddedNSQD(tls_cert=cert, tls_key=key, tls_root_ca_file=str(garbage))

    async def start() -> None:
        async with Cluster(nsqd_options={"tls_cert": missing, "tls_key": key}):
            raise AssertionError("started without its certificate")

    with pytest.raises(BaseException) as in_cluster:
        anyio.run(start)
    assert type(in_cluster.value) is TLSFileError, repr(in_cluster.value)


# --- TLS options that need a certificate: nsqd refuses to start ------------------------------

NSQD_REFUSAL = "cannot require TLS client connections without TLS key and cert"


@pytest.mark.parametrize("kind", ["embedded", "real"])
@pytest.mark.parametrize(
    "options",
    [
        {"tls_client_auth_policy": "require-verify"},
        {"tls_client_auth_policy": "require-verify", "tls_required": "tcp-https"},
        {"tls_required": True},
        {"tls_required": "tcp-https"},
    ],
    ids=["policy", "policy+tcp-https", "required", "tcp-https"],
)
def test_requiring_tls_without_a_certificate_is_refused_at_start(
    kind: str, options: dict[str, Any]
) -> None:
    """nsqd refuses to start, in these words; the embedded nsqd used to accept a client-auth
    policy without a certificate with its own words and type."""
    if kind == "embedded":
        with pytest.raises(ConfigError) as raised:
            EmbeddedNSQD(**options)
        assert NSQD_REFUSAL in str(raised.value)
        assert "tls_cert" in str(raised.value) and "tls_key" in str(raised.value)
        return
    if find_binaries() is None:
        pytest.skip(MISSING_BINARIES)
    flags, _ = nsqd_flags(**options)
    real = RealNSQD(flags)
    try:
        with pytest.raises(RuntimeError, match=NSQD_REFUSAL):
            real.start()
    finally:
        real.close()


def test_a_root_ca_without_a_certificate_is_refused(certificate: tuple[str, str]) -> None:
    """It would verify client certificates nobody can send: the embedded nsqd has no other
    use for it (nsqd also trusts it for its own HTTPS requests, to auth servers)."""
    cert, _ = certificate
    with pytest.raises(ConfigError, match="tls_root_ca_file needs tls_cert and tls_key"):
        EmbeddedNSQD(tls_root_ca_file=cert)


@pytest.mark.parametrize(
    ("options", "named"),
    [
        ({"tls_key": "key.pem"}, "tls_cert and tls_key must be given together"),
        ({"https_address": "127.0.0.1:0"}, "https_address needs tls_cert and tls_key"),
        ({"tls_required": "sometimes"}, "tls_required must be true, false or tcp-https"),
    ],
)
def test_other_tls_misconfigurations_are_config_errors(options: dict[str, Any], named: str) -> None:
    with pytest.raises(ConfigError, match=named):
        EmbeddedNSQD(**options)


def test_a_policy_other_than_require_verify_is_refused(certificate: tuple[str, str]) -> None:
    cert, key = certificate
    with pytest.raises(ConfigError, match="'require' is not supported here"):
        EmbeddedNSQD(tls_cert=cert, tls_key=key, tls_client_auth_policy="require")
    # "" is no policy, as for nsqd's flag
    EmbeddedNSQD(tls_cert=cert, tls_key=key, tls_client_auth_policy="")
