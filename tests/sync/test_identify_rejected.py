"""Issue 12.4 on the blocking transport: a configuration nsqd refuses at IDENTIFY fails the
consumer once, clearly (IdentifyRejected with nsqd's message), instead of reconnecting forever;
against the embedded nsqd and the real one (skipped without the binaries)."""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager

import pytest

from nsq_sansio.consumer import ConsumerFailed, Disconnected
from nsq_sansio.errors import IdentifyRejected
from transports.embedded import EmbeddedNSQD, ServerThread
from transports.real_nsq import RealNSQD, find_binaries
from transports.sync import Consumer

from ._helpers import unique, wait_for

KINDS = [
    "embedded",
    pytest.param(
        "real",
        marks=pytest.mark.skipif(find_binaries() is None, reason="real NSQ binaries not found"),
    ),
]

#: nsqd's --min-output-buffer-timeout is 25 ms: 10 ms is refused.
REFUSED = {"output_buffer_timeout": 0.01, "reconnect_delay": 0.05, "max_reconnect_delay": 0.1}
TEXT = "IDENTIFY output buffer timeout (10) is invalid"


@contextmanager
def broker(kind: str) -> Iterator[str]:
    """An nsqd's TCP address."""
    if kind == "real":
        with RealNSQD() as real:
            yield real.tcp_address
    else:
        thread = ServerThread(EmbeddedNSQD())
        try:
            yield thread.start().tcp_address
        finally:
            thread.stop()


def check(error: IdentifyRejected, events: list[object]) -> None:
    assert error.code == "E_BAD_BODY" and error.text == TEXT
    assert TEXT in str(error)
    # One connection, one refusal: after it nothing is retried (reconnect_delay is 50 ms).
    time.sleep(0.3)
    assert len([e for e in events if isinstance(e, Disconnected)]) == 1
    assert len([e for e in events if isinstance(e, ConsumerFailed)]) == 1


@pytest.mark.parametrize("kind", KINDS)
def test_iteration_and_get_raise_the_refusal(kind: str) -> None:
    events: list[object] = []
    with broker(kind) as address:
        consumer = Consumer(unique(), "ch", nsqd=[address], on_event=events.append, **REFUSED)
        with pytest.raises(IdentifyRejected) as info, consumer:
            for _ in consumer:
                raise AssertionError("no message can come")
        check(info.value, events)
        with pytest.raises(IdentifyRejected):  # every later ask says the same
            consumer.get(timeout=1.0)


@pytest.mark.parametrize("kind", KINDS)
def test_run_raises_the_refusal(kind: str) -> None:
    events: list[object] = []
    with broker(kind) as address:
        consumer = Consumer(unique(), "ch", nsqd=[address], on_event=events.append, **REFUSED)
        with pytest.raises(IdentifyRejected) as info, consumer:
            consumer.run(lambda message: None, threads=4)
        check(info.value, events)


@pytest.mark.parametrize("kind", KINDS)
def test_fetch_raises_the_refusal(kind: str) -> None:
    events: list[object] = []
    with broker(kind) as address:
        consumer = Consumer(
            unique(), "ch", nsqd=[address], pull=True, on_event=events.append, **REFUSED
        )
        with pytest.raises(IdentifyRejected) as info, consumer:
            while True:
                assert consumer.fetch(5, timeout=1.0) == []
        check(info.value, events)


def test_leaving_the_block_raises_a_refusal_nobody_waited_for() -> None:
    events: list[object] = []
    with broker("embedded") as address:
        with pytest.raises(IdentifyRejected, match=r"output buffer timeout \(10\)"):  # noqa: SIM117
            with Consumer(unique(), "ch", nsqd=[address], on_event=events.append, **REFUSED):
                wait_for(lambda: any(isinstance(e, ConsumerFailed) for e in events))
        assert len([e for e in events if isinstance(e, ConsumerFailed)]) == 1
