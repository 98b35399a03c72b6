"""Client scenarios written once and run on every runtime: asyncio and trio
(``transports.anyio``) and blocking (``transports.sync``), through ``support.runtimes``.

Each test takes ``runtime`` and is an ``async def`` (marked ``anyio``); the ``anyio_backend``
follows the runtime (the blocking one's scenario runs on asyncio, its calls on threads).
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from support.brokers import assert_no_thread_left
from support.runtimes import RUNTIMES, Runtime

from transports.testing.pytest_plugin import nsq_cluster, nsqd, nsqlookupd  # noqa: F401


@pytest.fixture(params=RUNTIMES)
def runtime(request: pytest.FixtureRequest) -> Runtime:
    return Runtime(str(request.param))


@pytest.fixture
def anyio_backend(runtime: Runtime) -> str:
    return runtime.anyio_backend


@pytest.fixture(autouse=True)
def no_thread_left_behind(request: pytest.FixtureRequest) -> Iterator[None]:
    """A blocking client leaves no thread of its own running (as in tests/sync)."""
    blocking = "runtime" in request.fixturenames and request.getfixturevalue("runtime").blocking
    yield
    if blocking:
        assert_no_thread_left()
