"""The clients (asyncio, trio, blocking) against a real nsqd v1.3.0.

A representative subset of ``tests/clients``, the test bodies unchanged: their ``nsqd`` fixture
gives a real process in the embedded broker's shape, and the broker's view of a channel comes
from the real ``/stats``. Round trip, snappy and deflate, refused names, RDY on the broker,
backoff, max attempts, drain, pull fetch, ``run()``. Tests that need a fresh channel's deferred or
timed-out messages back quickly are left out: the real nsqd scans a new channel's queues only
after its 5 s channel-list refresh.
"""

from __future__ import annotations

import pytest
from clients.conftest import anyio_backend, no_thread_left_behind, runtime  # noqa: F401
from clients.test_flow import (  # noqa: F401 (collected here against the real nsqd)
    test_backoff_after_a_failure_is_wired_to_the_broker,
    test_drain_with_messages_in_flight_loses_and_redelivers_nothing,
    test_fetch_batch_expiry_and_no_wait,
    test_max_attempts_gives_up,
    test_max_in_flight_is_respected_on_the_broker,
)
from clients.test_roundtrip import (  # noqa: F401
    test_compressed_connections,
    test_publish_consume_round_trip,
    test_publish_errors_are_raised_in_the_caller,
    test_run_finishes_on_return_and_requeues_on_raise,
)

from .conftest import RealBroker

pytestmark = pytest.mark.anyio


@pytest.fixture
def nsqd(real_nsqd: RealBroker) -> RealBroker:
    return real_nsqd
