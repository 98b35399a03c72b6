"""``keepalive()`` at nsqd's ``max_msg_timeout``, on every runtime: TOUCH cannot extend the
message past it, so the block says so once (one :class:`KeepaliveExpired`, before the deadline)
and stops touching, however long the block goes on after that.

A block that leaves at the first event cannot see a keepalive that goes on touching and
reporting past the limit; this one stays in the block until nsqd has taken the message back
and delivered it again, and counts what was said and sent meanwhile.
"""

from __future__ import annotations

import threading
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import anyio
import pytest
from support.brokers import running_nsqd, unique
from support.runtimes import Runtime

from nsq_sansio.connection import ClientConnection
from transports._common.message import KeepaliveExpired

MSG_TIMEOUT = 1.0
MAX_MSG_TIMEOUT = 2.0


@asynccontextmanager
async def keepalive(runtime: Runtime, message: Any) -> AsyncIterator[None]:
    """``async with msg.keepalive()`` / ``with msg.keepalive()`` (the blocking one only posts
    to its IO thread: entering and leaving it does not block the test's loop)."""
    if runtime.blocking:
        with message.keepalive():
            yield
    else:
        async with message.keepalive():
            yield


@pytest.fixture
def touches(monkeypatch: pytest.MonkeyPatch) -> list[bytes]:
    """The id of every TOUCH any client connection writes (from any thread), in order: each
    TOUCH the core emits goes through :meth:`ClientConnection.touch`."""
    seen: list[bytes] = []
    lock = threading.Lock()
    real_touch = ClientConnection.touch

    def counting_touch(self: ClientConnection, message_id: bytes) -> None:
        real_touch(self, message_id)
        with lock:
            seen.append(bytes(message_id))

    monkeypatch.setattr(ClientConnection, "touch", counting_touch)
    return seen


@pytest.mark.anyio
async def test_keepalive_reports_max_msg_timeout_once_and_stops_touching(
    runtime: Runtime, touches: list[bytes]
) -> None:
    """nsqd gives a message ``msg_timeout`` = 1 s and TOUCH extends it to 2 s at most. The
    block stays open past those 2 s (until nsqd delivers the message again): exactly one
    KeepaliveExpired for it, said before the deadline, and at most 3 TOUCHes. The schedule
    (half-way to each deadline) touches at 0.5 s and 1 s, which reaches the limit; the bound
    allows a third for a deadline that rounds a hair short of it. A keepalive that went on
    touching past the limit sends thousands in that second."""
    topic = unique()
    events: list[tuple[float, object]] = []

    def on_event(event: object) -> None:  # any thread: list.append is atomic
        events.append((time.monotonic(), event))

    with running_nsqd(msg_timeout=MSG_TIMEOUT, max_msg_timeout=MAX_MSG_TIMEOUT) as (server, _):
        async with runtime.producer(server.tcp_address) as p:
            await p.publish(topic, b"too long")
        async with runtime.consumer(
            topic, "c", nsqd=[server.tcp_address], max_in_flight=2, on_event=on_event
        ) as c:
            msg = await c.get(10)
            assert msg is not None and msg.attempts == 1
            async with keepalive(runtime, msg):
                again = await c.get(10)  # nsqd took it back at max_msg_timeout, sent it again
                assert again is not None and again.id == msg.id and again.attempts == 2
                assert time.monotonic() - msg.received_at >= MAX_MSG_TIMEOUT - 0.05
                touched_in_block = [t for t in touches if t == msg.id]
                expired = [(at, e) for at, e in events if isinstance(e, KeepaliveExpired)]
            assert await c.finish(again)
            with anyio.fail_after(10):
                while not msg.taken_back:  # known at once, or once the IO thread ran
                    await anyio.sleep(0.01)
            stats = c.stats()

    assert len(expired) == 1, f"{len(expired)} KeepaliveExpired events for one message"
    said_at, event = expired[0]
    assert isinstance(event, KeepaliveExpired) and event.message_id == msg.id
    assert event.deadline == pytest.approx(msg.received_at + MAX_MSG_TIMEOUT, abs=0.05)
    assert said_at < event.deadline, "the warning must come while there is time to answer"
    assert msg.keepalive_expiring and not again.keepalive_expiring
    assert 1 <= len(touched_in_block) <= 3, f"{len(touched_in_block)} TOUCHes for one message"
    # nothing touched after the block either (the redelivered copy was never under keepalive)
    assert [t for t in touches if t == msg.id] == touched_in_block
    assert stats.reconnects == 0 and stats.connection_errors == 0
