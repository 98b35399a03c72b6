"""Fixtures for the blocking transport's integration tests: embedded brokers on background
threads, over real loopback sockets (no mocks)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from support.brokers import assert_no_thread_left, running_nsqd

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
