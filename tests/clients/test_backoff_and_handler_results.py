"""Backoff and ``run()``'s handler results, the same on asyncio, trio and blocking, against the
embedded broker: what a handler's return value means (as in pynsq), and how backoff is
logged, counted in ``stats()`` and reported to ``on_event``."""

from __future__ import annotations

import logging
import threading
from typing import Any

import anyio
import anyio.to_thread
import pytest
from support.brokers import unique
from support.runtimes import Runtime

from nsq_sansio.backoff import BackoffPhase
from nsq_sansio.consumer import BackoffChanged
from transports._common.handlers import handler_finishes, handler_name
from transports.embedded import EmbeddedNSQD

pytestmark = pytest.mark.anyio


def _logger_name(runtime: Runtime) -> str:
    return f"nsq_sansio.{'sync' if runtime.blocking else 'anyio'}.consumer"


async def test_handler_results_mean_what_a_pynsq_user_expects(
    runtime: Runtime, nsqd: EmbeddedNSQD, caplog: pytest.LogCaptureFixture
) -> None:
    """None and True finish; False and raising requeue (with backoff); any other value is
    logged as a TypeError naming the handler and the value, and requeues. Each requeued
    message comes back once (its retry returns None)."""
    caplog.set_level(logging.INFO, logger="nsq_sansio")
    topic = unique()
    bodies = [b"none", b"true", b"false", b"int", b"raise"]
    async with runtime.producer(nsqd.tcp_address) as p:
        await p.multi_publish(topic, bodies)
    seen: list[tuple[bytes, int]] = []
    lock = threading.Lock()
    options: dict[str, Any] = {"max_in_flight": 5, "backoff_multiplier": 0.05}
    async with runtime.consumer(
        topic, "c", nsqd=[nsqd.tcp_address], default_requeue_delay=0.0, **options
    ) as c:

        def handler(msg: Any) -> object:
            with lock:
                seen.append((msg.body, msg.attempts))
                if len(seen) == 8:  # the five, and the retries of the three requeued
                    c.client.start_drain()
            if msg.attempts > 1:
                return None
            if msg.body == b"true":
                return True
            if msg.body == b"false":
                return False
            if msg.body == b"int":
                return 1
            if msg.body == b"raise":
                raise ValueError("downstream refused it")
            return None

        with anyio.fail_after(20):
            await c.run(handler, workers=5)
        stats = c.stats()
    assert sorted(seen) == sorted(
        [(body, 1) for body in bodies] + [(b"false", 2), (b"int", 2), (b"raise", 2)]
    )
    assert (stats.finished, stats.requeued, stats.given_up) == (5, 3, 0)
    assert stats.backoff_windows >= 1  # a REQ with backoff: the first one opened a window
    errors = [
        r
        for r in caplog.records
        if r.name == _logger_name(runtime) and r.levelno == logging.ERROR and r.exc_info
    ]
    by_type = {r.exc_info[0]: r for r in errors if r.exc_info is not None}
    assert set(by_type) == {TypeError, ValueError}, [r.getMessage() for r in errors]
    wrong = by_type[TypeError]
    assert wrong.exc_info is not None
    text = str(wrong.exc_info[1])
    assert "handler_results_mean_what_a_pynsq_user_expects.<locals>.handler returned 1" in text
    assert "expected None or True (finish the message) or False (requeue it)" in text
    assert wrong.getMessage().endswith("; requeueing it")
    assert wrong.nsq_error == text and wrong.nsq_attempts == 1


async def test_backoff_is_logged_counted_and_reported_the_same_on_every_runtime(
    runtime: Runtime, nsqd: EmbeddedNSQD, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="nsq_sansio")
    topic = unique()
    async with runtime.producer(nsqd.tcp_address) as p:
        await p.publish(topic, b"fails once")
    changes: list[BackoffChanged] = []
    async with runtime.consumer(
        topic,
        "c",
        nsqd=[nsqd.tcp_address],
        backoff_multiplier=0.25,
        default_requeue_delay=0.0,
        on_event=lambda e: changes.append(e) if isinstance(e, BackoffChanged) else None,
    ) as c:
        first = await c.get(10)
        assert first is not None
        if runtime.blocking:
            await anyio.to_thread.run_sync(first.requeue)
        else:
            await first.requeue()
        waiting = c.stats()
        second = await c.get(10)  # the test message, once the 0.5 s window is over
        assert second is not None and second.attempts == 2
        assert c.stats().backoff_phase == "testing"
        await c.finish(second)
        with anyio.fail_after(10):
            while c.stats().backoff_phase != "normal":
                await anyio.sleep(0.01)
        after = c.stats()
    assert (waiting.backoff_phase, waiting.backoff_level, waiting.backoff_windows) == (
        "waiting",
        1,
        1,
    )
    assert (after.backoff_level, after.backoff_windows) == (0, 1)
    lines = [
        (r.levelname, r.getMessage())
        for r in caplog.records
        if r.name == _logger_name(runtime)
        and ("backoff" in r.getMessage() or "backing off" in r.getMessage())
    ]
    assert lines == [
        ("INFO", "backing off 0.5 s after 1 failure (level 1)"),
        ("INFO", "testing after backoff (level 1)"),
        ("INFO", "resuming after backoff"),
    ]
    (opened,) = [r for r in caplog.records if r.getMessage().startswith("backing off")]
    assert (opened.nsq_topic, opened.nsq_channel, opened.nsq_delay, opened.nsq_count) == (
        topic,
        "c",
        0.5,
        1,
    )
    assert [(e.phase, e.level, e.window, e.failures) for e in changes] == [
        (BackoffPhase.WAITING, 1, 0.5, 1),
        (BackoffPhase.TESTING, 1, 0.0, 1),
        (BackoffPhase.NORMAL, 0, 0.0, 0),
    ]


def test_the_handler_result_rule(caplog: pytest.LogCaptureFixture) -> None:
    """The rule itself, on values the runtimes' tests do not reach: a coroutine a blocking
    handler returned (closed, so no 'never awaited' warning follows) and callables without
    a qualified name."""
    logger = logging.getLogger("nsq_sansio.test")
    caplog.set_level(logging.ERROR, logger="nsq_sansio.test")

    async def forgot_to_await(msg: object) -> None:
        """An async handler given to the blocking run()."""

    assert handler_finishes(None, print, logger, "127.0.0.1:4150", b"id")
    assert handler_finishes(True, print, logger, "127.0.0.1:4150", b"id")
    assert not handler_finishes(False, print, logger, "127.0.0.1:4150", b"id")
    assert not caplog.records
    coroutine = forgot_to_await(None)
    assert not handler_finishes(coroutine, forgot_to_await, logger, "127.0.0.1:4150", b"0a1b")
    assert coroutine.cr_frame is None  # closed
    (record,) = caplog.records
    assert record.getMessage() == "[127.0.0.1:4150] handler failed for message 0a1b; requeueing it"
    assert record.exc_info is not None and record.exc_info[0] is TypeError
    assert "a coroutine: the blocking run() calls plain functions" in str(record.exc_info[1])
    assert not handler_finishes("yes", print, logger, "127.0.0.1:4150", b"id")
    assert "run() handler builtins.print returned 'yes'" in str(caplog.records[-1].exc_info[1])

    class Handler:
        def __call__(self, msg: object) -> int:
            return 0

    assert handler_name(Handler()).startswith("<")  # an instance: its repr
    assert handler_name(Handler().__call__).endswith("Handler.__call__")
