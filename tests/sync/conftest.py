"""Fixtures for the blocking transport's integration tests: embedded brokers on background
threads, over real loopback sockets (no mocks)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from support.brokers import assert_no_thread_left, running_nsqd
from support.tls import make_test_ca

from transports.embedded import EmbeddedNSQD, ServerThread


@pytest.fixture
def nsqd() -> Iterator[tuple[EmbeddedNSQD, ServerThread[EmbeddedNSQD]]]:
    with running_nsqd() as pair:
        yield pair


@pytest.fixture(autouse=True)
def no_thread_left_behind() -> Iterator[None]:
    """Every test must leave no thread of ours running (consumer IO, workers, producer IO)."""
    yield
    assert_no_thread_left()


@pytest.fixture(scope="session")
def test_ca(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    """A private CA and a server certificate it signed for 127.0.0.1 / localhost, plus a
    client certificate; returns PEM file paths (ca, cert, key, client_cert, client_key).
    (tests/real's blocking TLS test takes it from here.)"""
    pytest.importorskip("cryptography")
    return make_test_ca(tmp_path_factory.mktemp("ca")).as_dict()
