"""The main log records carry their facts as ``nsq_*`` extra fields (docs/logging.md), with
the right values, on asyncio, trio and blocking, against the embedded nsqd."""

from __future__ import annotations

import functools
import logging
import os
import signal
from collections.abc import Callable
from typing import Any

import anyio
import anyio.to_thread
import pytest
from support.brokers import running_nsqd, unique
from support.runtimes import Runtime

import transports.anyio
import transports.sync

pytestmark = pytest.mark.anyio


async def _call(runtime: Runtime, method: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
    if runtime.blocking:
        return await anyio.to_thread.run_sync(functools.partial(method, *args, **kwargs))
    return await method(*args, **kwargs)


def _one(records: list[logging.LogRecord], text: str) -> logging.LogRecord:
    """The first record whose format string (``record.msg``) contains ``text``."""
    found = [r for r in records if text in str(r.msg)]
    assert found, (text, [r.getMessage() for r in records])
    return found[0]


def _facts(record: logging.LogRecord) -> dict[str, object]:
    return {k: v for k, v in vars(record).items() if k.startswith("nsq_")}


async def _signal_until_draining(consumer: Any) -> None:
    with anyio.fail_after(10):
        while not consumer.draining:
            # (never to a default handler: a runtime's that failed must not kill the tests)
            if signal.getsignal(signal.SIGUSR1) not in (signal.SIG_DFL, signal.SIG_IGN, None):
                os.kill(os.getpid(), signal.SIGUSR1)
            await anyio.sleep(0.05)


async def test_consumer_records_carry_their_facts(
    runtime: Runtime, caplog: pytest.LogCaptureFixture
) -> None:
    """Subscribed, an answer taken back, a give-up, a drain by signal: each record names its
    topic, channel, nsqd address, message id (hex text) and attempts as extra fields."""
    caplog.set_level(logging.DEBUG, logger="nsq_sansio")
    topic = unique()
    logger = f"nsq_sansio.{'sync' if runtime.blocking else 'anyio'}.consumer"
    with running_nsqd(msg_timeout=1.0) as (server, _):
        address = server.tcp_address
        async with runtime.producer(address) as p:
            await p.publish(topic, b"slow")
        options: dict[str, Any] = {"nsqd": [address], "max_in_flight": 2, "max_attempts": 2}
        async with runtime.consumer(topic, "c", **options) as c:
            old = await c.get(10)
            new = await c.get(10)  # the same message again, after its 1 s timeout
            assert old is not None and new is not None and new.id == old.id
            await _call(runtime, old.finish)  # too late: nsqd took it back
            with anyio.fail_after(10):
                while not old.taken_back:
                    await anyio.sleep(0.01)
            await _call(runtime, new.requeue, 0, backoff=False)  # its 3rd attempt: give up
            with anyio.fail_after(10):
                while c.stats().given_up < 1:
                    await anyio.sleep(0.01)
            module: Any = transports.sync if runtime.blocking else transports.anyio
            # The anyio runtimes listen for the signal from a task of their own: until it
            # runs, a no-op handler keeps the signal from killing the test; it is sent again
            # until the drain starts.
            previous = signal.signal(signal.SIGUSR1, lambda *_: None)
            try:
                drainer = module.drain_on_signals(c.client, signal.SIGUSR1)
                if runtime.blocking:
                    with drainer:
                        await _signal_until_draining(c.client)
                else:
                    async with drainer:
                        await _signal_until_draining(c.client)
            finally:
                signal.signal(signal.SIGUSR1, previous)
    records = [r for r in caplog.records if r.name == logger]
    where = {"nsq_topic": topic, "nsq_channel": "c"}
    hex_id = old.id.decode("ascii")

    subscribed = _one(records, "subscribed to")
    assert subscribed.levelname == "INFO"
    assert _facts(subscribed) == {**where, "nsq_address": address, "nsq_state": "subscribed"}

    # (nsqd's timeout is reported too: a TIMEOUT record, then the FIN's)
    late = _one([r for r in records if getattr(r, "nsq_command", "") == "FIN"], "came too late")
    assert late.levelname == "WARNING"
    facts = _facts(late)
    assert facts.pop("nsq_error")
    assert facts == {
        **where,
        "nsq_address": address,
        "nsq_message_id": hex_id,
        "nsq_command": "FIN",
    }

    give_up = _one(records, "giving up on message")
    assert give_up.levelname == "WARNING"
    assert _facts(give_up) == {
        **where,
        "nsq_address": address,
        "nsq_message_id": hex_id,
        "nsq_attempts": 3,
    }

    drain = _one(records, "received: draining the consumer")
    assert drain.levelname == "WARNING"
    assert _facts(drain) == {**where, "nsq_signal": "SIGUSR1", "nsq_state": "draining"}

    if not runtime.blocking:  # the TCP connect, before IDENTIFY (the blocking one says nothing)
        connected = _one(records, "connected")
        assert connected.levelname == "DEBUG"
        assert _facts(connected)["nsq_address"] == address
        assert _facts(connected)["nsq_state"] == "connected"


async def test_lost_connections_say_when_they_reconnect(
    runtime: Runtime, caplog: pytest.LogCaptureFixture
) -> None:
    """nsqd stops under a consumer and a producer: the consumer's record says it reconnects
    (state, delay, messages unanswered) and the producer's which nsqd it could not reach."""
    caplog.set_level(logging.INFO, logger="nsq_sansio")
    topic = unique()
    kind = "sync" if runtime.blocking else "anyio"
    with running_nsqd() as (server, runner):
        address = server.tcp_address
        async with runtime.producer(address) as p:
            await p.publish(topic, b"held")
            async with runtime.consumer(topic, "c", nsqd=[address]) as c:
                held = await c.get(10)
                assert held is not None
                runner.stop()
                with anyio.fail_after(10):
                    while c.stats().connected:
                        await anyio.sleep(0.01)
                with pytest.raises(Exception):  # noqa: B017 - which one is not the point
                    await p.publish(topic, b"lost")
    lost = _one(
        [r for r in caplog.records if r.name == f"nsq_sansio.{kind}.consumer"], "connection lost"
    )
    assert lost.levelname == "WARNING"
    facts = _facts(lost)
    assert facts.pop("nsq_error")
    delay = facts.pop("nsq_delay")
    assert isinstance(delay, float) and 0 <= delay <= 120, delay
    assert facts == {
        "nsq_topic": topic,
        "nsq_channel": "c",
        "nsq_address": address,
        "nsq_count": 1,
        "nsq_state": "reconnecting",
    }
    producer = [r for r in caplog.records if r.name == f"nsq_sansio.{kind}.producer"]
    down = [r for r in producer if r.levelno == logging.WARNING]
    assert down, [r.getMessage() for r in caplog.records]
    for record in down:
        assert record.nsq_address == address  # type: ignore[attr-defined]
        assert record.nsq_error  # type: ignore[attr-defined]
        assert record.nsq_state == "reconnecting"  # type: ignore[attr-defined]
