"""The anyio clients (``transports.anyio``) against a real nsqd v1.3.0, on asyncio and trio.

A representative subset of ``tests/aio``, the test bodies unchanged: the ``nsqd``,
``make_nsqd`` and ``nsqlookupd`` fixtures give real processes in the embedded fixtures' shape.
Round trip, compression, TLS with a private CA, two real nsqd found through a real nsqlookupd,
RDY on the broker, backoff, max attempts, drain and pull fetch.
"""

from __future__ import annotations

from collections.abc import Callable

import pytest
from aio.conftest import test_ca  # noqa: F401 (fixture, as in tests/aio)
from aio.test_consumer import (  # noqa: F401 (collected here against the real nsqd)
    test_backoff_after_failures,
    test_drain_with_messages_in_flight,
    test_fetch_batch_expiry_and_no_wait,
    test_max_attempts_gives_up,
    test_max_in_flight_is_respected_on_the_broker,
)
from aio.test_roundtrip import (  # noqa: F401
    test_compression_round_trip,
    test_publish_consume_round_trip,
    test_publish_errors_are_raised,
    test_several_nsqd_through_lookupd,
    test_tls_with_a_test_ca,
)

from .conftest import RealBroker, RealLookupdView

pytestmark = pytest.mark.anyio


@pytest.fixture(params=["asyncio", "trio"])
def anyio_backend(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@pytest.fixture
def nsqd(real_nsqd: RealBroker) -> RealBroker:
    return real_nsqd


@pytest.fixture
def make_nsqd(make_real_nsqd: Callable[..., RealBroker]) -> Callable[..., RealBroker]:
    return make_real_nsqd


@pytest.fixture
def nsqlookupd(real_lookupd: RealLookupdView) -> RealLookupdView:
    return real_lookupd
