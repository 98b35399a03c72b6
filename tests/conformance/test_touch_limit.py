"""TOUCH extends a message's timeout by the client's msg_timeout, never past max_msg_timeout
from its delivery; then the message is requeued like any other timeout (nsqd channel.go
TouchMessage). Needs a small ``--max-msg-timeout``: the embedded and the real target each get
their own nsqd with msg_timeout 1 s and a short max_msg_timeout; an external nsqd is used only
when the ``max_msg_timeout`` its IDENTIFY reports is at most 10 s (otherwise the test skips).

The real nsqd gets 6 s rather than 3 s: its queue scan picks up a new channel's in-flight
messages only at its next channel-list refresh (every 5 s, not configurable in 1.3.0), so the
limit it enforces on a fresh channel is only exact when it is above that refresh interval."""

from __future__ import annotations

import time
from collections.abc import Iterator

import pytest

from transports.real_nsq import RealNSQD

from .conftest import EXTERNAL, Target, embedded_backend
from .wire import FRAME_MESSAGE, RawConn, unique

_MAX_USABLE_MS = 10_000


@pytest.fixture(scope="module")
def small_timeouts(target: Target) -> Iterator[str]:
    """The TCP address of an nsqd with a max_msg_timeout small enough to wait for."""
    if target.kind == EXTERNAL:
        with RawConn(target.tcp) as probe:
            info = probe.identify()
        assert isinstance(info, dict)
        if info["max_msg_timeout"] > _MAX_USABLE_MS:
            pytest.skip(
                f"nsqd max_msg_timeout is {info['max_msg_timeout']} ms; run it with "
                "--max-msg-timeout=3s to check TOUCH's limit"
            )
        yield target.tcp
        return
    if target.real:
        with RealNSQD(["--msg-timeout=1s", "--max-msg-timeout=6s"]) as real:
            yield real.tcp_address
        return
    from transports.embedded import EmbeddedNSQD, ServerThread

    server = EmbeddedNSQD(msg_timeout=1.0, max_msg_timeout=3.0)
    with ServerThread(server, backend=embedded_backend()) as nsqd:
        yield nsqd.tcp_address


def test_touch_extends_up_to_max_msg_timeout_then_the_message_is_requeued(
    small_timeouts: str,
) -> None:
    topic, channel = unique(), unique("c")
    with RawConn(small_timeouts) as c:
        info = c.identify(msg_timeout=1000)
        assert isinstance(info, dict) and info["msg_timeout"] == 1000
        max_timeout = info["max_msg_timeout"] / 1000
        c.pub(topic, b"long job")
        c.expect_ok()
        c.sub(topic, channel)
        c.command("RDY 1")
        first = c.read_message()
        delivered = time.monotonic()
        assert first.attempts == 1
        c.sock.settimeout(0.25)
        redelivered = None
        while time.monotonic() - delivered < max_timeout + 5:
            c.command(f"TOUCH {first.id.decode()}")  # every 0.25 s: always within 1 s
            try:
                kind, data = c.read_frame()
            except TimeoutError:
                continue
            assert kind == FRAME_MESSAGE, (kind, data)  # TOUCH itself has no answer
            redelivered = data
            break
        elapsed = time.monotonic() - delivered
        assert redelivered is not None, "the touched message was never requeued"
        # held well past msg_timeout (1 s) by the touches, taken back at max_msg_timeout
        assert max_timeout - 0.3 <= elapsed <= max_timeout + 1.5, elapsed
        assert redelivered[10:26] == first.id
        assert int.from_bytes(redelivered[8:10], "big") == 2  # attempts
        c.sock.settimeout(10)
        c.command(f"FIN {first.id.decode()}")  # the new delivery (same id) is answerable
        assert c.nothing_within(0.3)
