"""Dead-letter topics against a real nsqd v1.3.0 (skipped when the binaries are absent), on
asyncio, trio and blocking: the test bodies of ``tests/clients/test_dead_letters.py``,
unchanged, with the real nsqd as the ``nsqd`` fixture."""

from __future__ import annotations

import pytest
from clients.test_dead_letters import (  # noqa: F401 (collected here against the real nsqd)
    test_a_poison_message_lands_on_the_dead_letter_topic_once_then_is_finished,
    test_pull_mode_dead_letters_too,
    test_run_envelope_carries_id_attempts_source_and_the_handler_error,
)
from support.runtimes import RUNTIMES, Runtime

from .conftest import RealBroker


@pytest.fixture(params=RUNTIMES)
def runtime(request: pytest.FixtureRequest) -> Runtime:
    return Runtime(str(request.param))


@pytest.fixture
def anyio_backend(runtime: Runtime) -> str:
    return runtime.anyio_backend


@pytest.fixture
def nsqd(real_nsqd: RealBroker) -> RealBroker:
    return real_nsqd
