"""One contract on every runtime: ``transports.anyio`` (asyncio), ``transports.trio`` and
``transports.sync`` (blocking) offer the same names, the same signatures and defaults, the same
return annotations, and raise the same exception for the same misuse.

In the manner of trio's ``test_exports.py``: the public surface is walked, not listed by hand,
so a name added or renamed on one runtime only fails here until it is added on the other too,
or written down below as a difference that is inherent (with why). Then each documented misuse
is made on asyncio, trio and blocking against the embedded broker, and must raise the exception
type the docs name (exactly that type).
"""

from __future__ import annotations

import functools
import inspect
import logging
import math
import re
from collections.abc import Callable
from dataclasses import dataclass, fields
from typing import Any

import anyio
import anyio.to_thread
import pytest
from support.brokers import running_nsqd, unique
from support.runtimes import Runtime

import transports.anyio
import transports.sync
import transports.trio
from nsq_sansio.errors import ConfigError, DelayOutOfRange, InvalidName, LocalProtocolError
from transports._common import CONNECTION_STATES, ConsumerStats
from transports.embedded import EmbeddedNSQD

# --- what may differ, and why ------------------------------------------------------------------

#: Names only one runtime's package exports.
ONLY_SYNC_EXPORTS = {
    # What ``publish_async()`` returns: a blocking caller needs a handle to wait on later;
    # async code starts publishes as tasks instead.
    "PublishFuture",
}

#: The protocols each side implements (the other side's name for the same thing).
PROTOCOLS = {
    "__aenter__": "__enter__",
    "__aexit__": "__exit__",
    "__aiter__": "__iter__",
}

#: Members one runtime has and the other has not: ``(class, name)``.
ONLY_ANYIO_MEMBERS = {
    # ``__aiter__`` returns the consumer itself, whose ``__anext__`` gives the next message;
    # ``__iter__`` returns a generator.
    ("Consumer", "__anext__"),
    # An awaitable answer's variant that does not wait (trio's ``send_nowait`` style): the
    # blocking calls never wait, so they need no second name.
    ("Consumer", "finish_many_nowait"),
    ("Message", "finish_nowait"),
    ("Message", "requeue_nowait"),
}
ONLY_SYNC_MEMBERS = {
    # One message within a timeout: async code takes ``anext()`` under a cancel scope
    # (``move_on_after``); a blocking caller has no cancel scope.
    ("Consumer", "get"),
    # Publishes that do not wait return a PublishFuture (see ONLY_SYNC_EXPORTS), and
    # ``flush()`` waits for all of them.
    ("Producer", "publish_async"),
    ("Producer", "multi_publish_async"),
    ("Producer", "deferred_publish_async"),
    ("Producer", "flush"),
}

#: Parameters one side has: ``(class, method) -> names``. A blocking publish takes its own
#: deadline (``timeout=``): async code puts the call under ``fail_after``.
ONLY_SYNC_PARAMETERS = {
    ("Producer", "publish"): {"timeout"},
    ("Producer", "multi_publish"): {"timeout"},
    ("Producer", "deferred_publish"): {"timeout"},
}

#: What an annotation says on the async side when the blocking side says the other thing:
#: async context managers and iterators, a handler that returns an awaitable.
ASYNC_SPELLINGS = (
    ("AsyncIterator[", "Iterator["),
    ("Callable[[Message], Awaitable[object]]", "Callable[[Message], object]"),
)

#: Methods that are coroutines on the async side (every other public callable is plain on both).
COROUTINES = {
    "Consumer": {
        "__aenter__",
        "__aexit__",
        "__anext__",
        "start",
        "close",
        "drain",
        "run",
        "fetch",
        "finish_many",
    },
    "Producer": {
        "__aenter__",
        "__aexit__",
        "close",
        "connect",
        "publish",
        "multi_publish",
        "deferred_publish",
    },
    "HTTPProducer": {
        "__aenter__",
        "__aexit__",
        "close",
        "publish",
        "multi_publish",
        "deferred_publish",
    },
    # keepalive() is entered with ``async with`` there, ``with`` here.
    "Message": {"finish", "requeue", "touch", "keepalive"},
}

#: Made by the library, never by user code: their constructors are not part of the API.
NOT_USER_MADE = {"Message"}


# --- the walk -----------------------------------------------------------------------------------


def _public(name: str) -> bool:
    return (
        not name.startswith("_")
        or name in PROTOCOLS
        or name in PROTOCOLS.values()
        or (name in ("__anext__", "__init__"))
    )


def _async_spelling(text: str) -> str:
    for async_text, blocking_text in ASYNC_SPELLINGS:
        text = text.replace(async_text, blocking_text)
    return text


@dataclass(frozen=True)
class Member:
    kind: str  # "method", "property", "attribute"
    is_coroutine: bool
    signature: tuple[tuple[str, str, str, str], ...]  # (name, kind, default, annotation)
    returns: str


def _member(cls: type, name: str) -> Member:
    raw = inspect.getattr_static(cls, name)
    if isinstance(raw, property):
        assert raw.fget is not None
        returns = str(raw.fget.__annotations__.get("return", ""))
        return Member("property", False, (), _async_spelling(returns))
    value = getattr(cls, name)
    if not callable(value):
        return Member("attribute", False, (), "")
    if isinstance(raw, staticmethod | classmethod):
        value = raw.__func__
    function = inspect.unwrap(value)
    is_coroutine = inspect.iscoroutinefunction(function) or inspect.isasyncgenfunction(function)
    signature = inspect.signature(value)
    parameters = tuple(
        (
            p.name,
            str(p.kind),
            repr(p.default),
            _async_spelling(str(p.annotation)),
        )
        for p in signature.parameters.values()
        if p.name != "self"
    )
    returns = _async_spelling(str(signature.return_annotation))
    return Member("method", is_coroutine, parameters, returns)


def _surface(cls: type) -> dict[str, Member]:
    return {name: _member(cls, name) for name in dir(cls) if _public(name)}


def _compare(name: str, async_cls: type, sync_cls: type) -> list[str]:
    """Every difference between the two classes' surfaces that is not written down above."""
    problems: list[str] = []
    async_surface, sync_surface = _surface(async_cls), _surface(sync_cls)
    if name in NOT_USER_MADE:
        del async_surface["__init__"], sync_surface["__init__"]
    for member in sorted(set(async_surface) | set(sync_surface)):
        twin = PROTOCOLS.get(member, member)
        if member in PROTOCOLS.values():
            continue  # compared from its async name
        ours, theirs = async_surface.get(member), sync_surface.get(twin)
        if ours is None or theirs is None:
            if ours is None and (name, twin) in ONLY_SYNC_MEMBERS:
                continue
            if theirs is None and (name, member) in ONLY_ANYIO_MEMBERS:
                continue
            if ours is None and member in PROTOCOLS.values():
                continue
            side = "transports.sync" if ours is None else "transports.anyio"
            problems.append(f"{name}.{twin if ours is None else member}: only in {side}")
            continue
        if ours.kind != theirs.kind:
            problems.append(f"{name}.{member}: a {ours.kind} on anyio, a {theirs.kind} on sync")
            continue
        expected_coroutine = member in COROUTINES.get(name, set())
        if ours.is_coroutine != expected_coroutine:
            problems.append(f"{name}.{member}: coroutine on anyio is {ours.is_coroutine}")
        if theirs.is_coroutine:
            problems.append(f"{name}.{twin}: a coroutine on the blocking side")
        extra = ONLY_SYNC_PARAMETERS.get((name, member), set())
        sync_signature = tuple(p for p in theirs.signature if p[0] not in extra)
        if ours.signature != sync_signature and member not in PROTOCOLS:
            problems.append(
                f"{name}.{member}: parameters differ:\n  anyio {ours.signature}\n"
                f"  sync  {sync_signature}"
            )
        if member in PROTOCOLS:  # the context managers return the class itself
            continue
        if ours.returns != theirs.returns:
            problems.append(
                f"{name}.{member}: returns {ours.returns!r} on anyio, {theirs.returns!r} on sync"
            )
    return problems


def test_the_runtimes_export_the_same_names() -> None:
    anyio_names = set(transports.anyio.__all__)
    assert set(transports.trio.__all__) == anyio_names
    assert set(transports.sync.__all__) - anyio_names == ONLY_SYNC_EXPORTS
    assert anyio_names - set(transports.sync.__all__) == set()
    for module in (transports.anyio, transports.trio, transports.sync):
        for name in module.__all__:
            assert hasattr(module, name), f"{module.__name__}.{name} is in __all__ only"


#: The exports that are one object for every runtime (the others are each runtime's own).
SHARED = {
    "ConnectionStats",
    "ConsumerStats",
    "DrainResult",
    "EventCallback",
    "HTTPPublishError",
    "KeepaliveExpired",
    "NoNSQDAvailable",
    "ProducerStats",
    "PublishObserver",
    "TLSOptions",
}


def test_shared_names_are_one_object_with_a_public_home() -> None:
    for name in SHARED:
        assert getattr(transports.anyio, name) is getattr(transports.sync, name), name
        assert getattr(transports.trio, name) is getattr(transports.anyio, name), name
    for name in ("NoNSQDAvailable", "HTTPPublishError"):
        # An exception's module is where a traceback says it comes from: a public one.
        assert getattr(transports.sync, name).__module__ == "nsq_sansio.errors"


@pytest.mark.parametrize("name", ["Consumer", "Producer", "HTTPProducer", "Message"])
def test_each_class_has_the_same_surface(name: str) -> None:
    problems = _compare(name, getattr(transports.anyio, name), getattr(transports.sync, name))
    assert not problems, "\n".join(problems)


@pytest.mark.parametrize("name", ["Consumer", "Producer", "HTTPProducer", "Message"])
def test_trio_classes_are_the_anyio_ones(name: str) -> None:
    trio_cls, anyio_cls = getattr(transports.trio, name), getattr(transports.anyio, name)
    assert issubclass(trio_cls, anyio_cls)
    assert _surface(trio_cls) == _surface(anyio_cls)


def test_drain_on_signals_has_one_signature() -> None:
    async_signature = inspect.signature(transports.anyio.drain_on_signals)
    sync_signature = inspect.signature(transports.sync.drain_on_signals)
    assert [(p.name, p.kind, p.default) for p in async_signature.parameters.values()] == [
        (p.name, p.kind, p.default) for p in sync_signature.parameters.values()
    ]


def test_the_blocking_consumer_does_not_expose_its_io_loop() -> None:
    """Its IO thread's callbacks are an owned object's, not public methods of the consumer."""
    for cls in (transports.sync.Consumer, transports.sync.Producer):
        for name in (
            "on_data",
            "on_connected",
            "on_link_error",
            "on_tls_established",
            "handle_timer",
            "next_deadline",
            "write_pending",
        ):
            assert not hasattr(cls, name), f"{cls.__name__}.{name}"


# --- misuses: the same exception on every runtime ----------------------------------------------

NOT_SECONDS = (-1, math.nan, math.inf, "5")


@dataclass(frozen=True)
class Misuse:
    """One documented misuse: ``call(client)`` on a client made with ``options`` (or
    ``build(module)`` for a constructor) raises ``error``, exactly."""

    what: str
    client: str  # "push", "pull", "producer", "http", "message", "constructor"
    call: Callable[[Any], Any]
    error: type[BaseException]
    options: tuple[tuple[str, Any], ...] = ()


def _iterate(consumer: Any) -> Any:
    return consumer.__aiter__() if hasattr(consumer, "__aiter__") else iter(consumer)


MISUSES = [
    # consumers
    Misuse("fetch() on a push consumer", "push", lambda c: c.fetch(1), LocalProtocolError),
    Misuse("iterating a pull consumer", "pull", _iterate, LocalProtocolError),
    Misuse("run() on a pull consumer", "pull", lambda c: c.run(lambda m: None), LocalProtocolError),
    Misuse("fetch(0)", "pull", lambda c: c.fetch(0), LocalProtocolError),
    Misuse("fetch(True)", "pull", lambda c: c.fetch(True), LocalProtocolError),
    *(
        Misuse(
            f"fetch(timeout={t!r})",
            "pull",
            lambda c, t=t: c.fetch(1, timeout=t),
            LocalProtocolError,
        )
        for t in (*NOT_SECONDS, 0)
    ),
    Misuse(
        "run(concurrency=0)",
        "push",
        lambda c: c.run(lambda m: None, concurrency=0),
        LocalProtocolError,
    ),
    Misuse("run(handler not callable)", "push", lambda c: c.run("x"), LocalProtocolError),
    *(
        Misuse(f"drain(timeout={t!r})", "push", lambda c, t=t: c.drain(t), LocalProtocolError)
        for t in NOT_SECONDS
    ),
    *(
        Misuse(f"start_drain({t!r})", "push", lambda c, t=t: c.start_drain(t), LocalProtocolError)
        for t in NOT_SECONDS
    ),
    Misuse("start() twice", "push", lambda c: c.start(), LocalProtocolError),
    Misuse("set_max_in_flight(-1)", "push", lambda c: c.set_max_in_flight(-1), ConfigError),
    Misuse(
        "finish_many() of something not a message",
        "push",
        lambda c: c.finish_many(["not a message"]),
        TypeError,
    ),
    # a message
    *(
        Misuse(f"requeue(delay={d!r})", "message", lambda m, d=d: m.requeue(d), LocalProtocolError)
        for d in NOT_SECONDS
    ),
    Misuse(
        "requeue() above a known max_req_timeout",
        "message",
        lambda m: m.requeue(20),
        DelayOutOfRange,
        options=(("max_req_timeout", 10.0),),
    ),
    # producers
    *(
        Misuse(
            f"deferred_publish(delay={d!r})",
            kind,
            lambda p, d=d: p.deferred_publish("t", b"x", d),
            LocalProtocolError,
        )
        for d in NOT_SECONDS
        for kind in ("producer", "http")
    ),
    Misuse(
        "deferred_publish() of 5000 seconds (milliseconds meant)",
        "producer",
        lambda p: p.deferred_publish("t", b"x", 5000),
        DelayOutOfRange,
    ),
    *(
        Misuse(
            f"{kind}: publish to a bad topic",
            kind,
            lambda p: p.publish("bad topic!", b"x"),
            InvalidName,
        )
        for kind in ("producer", "http")
    ),
    *(
        Misuse(f"{kind}: publish a str", kind, lambda p: p.publish("t", "text"), LocalProtocolError)
        for kind in ("producer", "http")
    ),
    *(
        Misuse(
            f"{kind}: publish an empty body",
            kind,
            lambda p: p.publish("t", b""),
            LocalProtocolError,
        )
        for kind in ("producer", "http")
    ),
    *(
        Misuse(
            f"{kind}: multi_publish([])",
            kind,
            lambda p: p.multi_publish("t", []),
            LocalProtocolError,
        )
        for kind in ("producer", "http")
    ),
    *(
        Misuse(
            f"{kind}: multi_publish(one body)",
            kind,
            lambda p: p.multi_publish("t", b"body"),
            LocalProtocolError,
        )
        for kind in ("producer", "http")
    ),
    Misuse("connect(timeout=-1)", "producer", lambda p: p.connect(-1), LocalProtocolError),
    Misuse("close(timeout=-1)", "producer", lambda p: p.close(-1), LocalProtocolError),
    # constructors
    Misuse(
        "an unknown option",
        "constructor",
        lambda m: m.Consumer("t", "c", nsqd="127.0.0.1:1", no_such_option=1),
        ConfigError,
    ),
    Misuse(
        "start_drain() before start()",
        "constructor",
        lambda m: m.Consumer("t", "c", nsqd="127.0.0.1:1").start_drain(),
        LocalProtocolError,
    ),
    Misuse(
        "Consumer(close_timeout=-1)",
        "constructor",
        lambda m: m.Consumer("t", "c", nsqd="127.0.0.1:1", close_timeout=-1),
        ConfigError,
    ),
    Misuse(
        "a bad channel name",
        "constructor",
        lambda m: m.Consumer("t", "bad channel", nsqd="127.0.0.1:1"),
        InvalidName,
    ),
    Misuse("Producer([])", "constructor", lambda m: m.Producer([]), ConfigError),
    Misuse(
        "Producer(max_pending=0)",
        "constructor",
        lambda m: m.Producer("127.0.0.1:1", max_pending=0),
        ConfigError,
    ),
    Misuse(
        "Producer(timeout=0)",
        "constructor",
        lambda m: m.Producer("127.0.0.1:1", timeout=0),
        ConfigError,
    ),
    Misuse(
        "HTTPProducer(timeout=-1)",
        "constructor",
        lambda m: m.HTTPProducer("http://127.0.0.1:1", timeout=-1),
        ConfigError,
    ),
    Misuse(
        "HTTPProducer(max_connections=0)",
        "constructor",
        lambda m: m.HTTPProducer("http://127.0.0.1:1", max_connections=0),
        ConfigError,
    ),
]


async def _made(result: Any) -> Any:
    """Await what an async call returned (the blocking calls raise or return at once)."""
    if inspect.isawaitable(result):
        return await result
    return result


async def _check(misuse: Misuse, client: Any) -> None:
    with pytest.raises(BaseException) as raised:
        await _made(misuse.call(client))
    assert type(raised.value) is misuse.error, (
        f"{misuse.what}: raised {raised.value!r}, documented {misuse.error.__name__}"
    )


@pytest.mark.anyio
@pytest.mark.parametrize("misuse", MISUSES, ids=[m.what for m in MISUSES])
async def test_a_misuse_raises_the_documented_exception(
    runtime: Runtime, nsqd: EmbeddedNSQD, misuse: Misuse
) -> None:
    module = runtime.module
    if misuse.client == "constructor":
        await _check(misuse, module)
        return
    if misuse.client in ("push", "pull", "message"):
        topic = "parity"
        if misuse.client == "message":
            async with runtime.producer(nsqd.tcp_address) as p:
                await p.publish(topic, b"x")
        pull = misuse.client == "pull"
        options = dict(misuse.options)
        async with runtime.consumer(topic, "c", nsqd=[nsqd.tcp_address], pull=pull, **options) as c:
            if misuse.client == "message":
                message = await c.get(10)
                assert message is not None
                await _check(misuse, message)
                assert not message.answered  # the bad call answered nothing
            else:
                await _check(misuse, c.client)
        return
    if misuse.client == "producer":
        async with runtime.producer(nsqd.tcp_address) as p:
            await _check(misuse, p.client)
        return
    http_producer = module.HTTPProducer(nsqd.http_url)
    await _check(misuse, http_producer)
    await _made(http_producer.close())


@pytest.mark.anyio
async def test_publishing_after_close_raises_local_protocol_error(
    runtime: Runtime, nsqd: EmbeddedNSQD
) -> None:
    async with runtime.producer(nsqd.tcp_address) as p:
        pass
    with pytest.raises(LocalProtocolError, match="closed"):
        await _made(p.client.publish("t", b"x"))
    http_producer = runtime.module.HTTPProducer(nsqd.http_url)
    await _made(http_producer.close())
    with pytest.raises(LocalProtocolError, match="closed"):
        await _made(http_producer.publish("t", b"x"))


# --- the same behaviour: answers, late answers, stats, logs -----------------------------------


async def _call(runtime: Runtime, method: Any, *args: Any, **kwargs: Any) -> Any:
    """A client method, awaited (async) or run on a worker thread (blocking)."""
    if runtime.blocking:
        return await anyio.to_thread.run_sync(functools.partial(method, *args, **kwargs))
    return await method(*args, **kwargs)


@pytest.mark.anyio
async def test_answers_return_the_same_on_every_runtime(
    runtime: Runtime, nsqd: EmbeddedNSQD
) -> None:
    """finish()/requeue() are True when this call answered the message, False when it was
    answered already; touch() is False once it was answered (nothing is sent)."""
    topic = unique()
    async with runtime.producer(nsqd.tcp_address) as p:
        await p.multi_publish(topic, [b"a", b"b"])
    async with runtime.consumer(topic, "c", nsqd=[nsqd.tcp_address], max_in_flight=2) as c:
        first, second = await c.get(10), await c.get(10)
        assert first is not None and second is not None
        assert await _call(runtime, second.touch) is True
        assert await _call(runtime, first.finish) is True
        assert await _call(runtime, first.finish) is False
        assert await _call(runtime, first.requeue) is False
        assert await _call(runtime, first.touch) is False
        assert await _call(runtime, second.requeue, 0, backoff=False) is True
        assert await _call(runtime, second.finish) is False
        assert first.answered and second.answered
        assert not first.taken_back and not second.taken_back
        assert not first.keepalive_expiring


@pytest.mark.anyio
async def test_a_late_answer_is_taken_back_and_logged_the_same(
    runtime: Runtime, caplog: pytest.LogCaptureFixture
) -> None:
    """nsqd times a held message out and delivers it again: answering the old copy is
    accepted by the call (True) and never raised; that copy turns ``taken_back``, the new one
    does not; and the same WARNING line is logged on every runtime."""
    caplog.set_level(logging.INFO, logger="nsq_sansio")
    topic = unique()
    with running_nsqd(msg_timeout=1.0) as (server, _):
        async with runtime.producer(server.tcp_address) as p:
            await p.publish(topic, b"slow")
        async with runtime.consumer(topic, "c", nsqd=[server.tcp_address], max_in_flight=2) as c:
            old = await c.get(10)
            new = await c.get(10)  # the same message, sent again after its 1 s timeout
            assert old is not None and new is not None and new.id == old.id
            assert await _call(runtime, old.finish) is True
            with anyio.fail_after(10):
                while not old.taken_back:  # known at once, or once the IO thread ran
                    await anyio.sleep(0.01)
            assert not new.taken_back
            assert await _call(runtime, new.finish) is True
    logger = f"nsq_sansio.{'sync' if runtime.blocking else 'anyio'}.consumer"
    late = [r for r in caplog.records if "came too late" in r.getMessage()]
    assert late and all(r.name == logger and r.levelname == "WARNING" for r in late)
    pattern = rf"\[{re.escape(server.tcp_address)}\] FIN for message {old.id.decode()} came "
    assert any(re.match(pattern, r.getMessage()) for r in late), [r.getMessage() for r in late]
    for record in late:  # each fact once: the id as hex text, once; the address once
        text = record.getMessage()
        assert "b'" not in text and text.count(old.id.decode()) == 1, text
        assert text.count(server.tcp_address) == 1, text
    subscribed = [r for r in caplog.records if "subscribed to" in r.getMessage()]
    assert subscribed and subscribed[0].levelname == "INFO"
    assert re.match(
        rf"\[{re.escape(server.tcp_address)}\] subscribed to {topic}/c \(nsqd \S+, "
        r"max_rdy_count \d+, msg_timeout 1s\)$",
        subscribed[0].getMessage(),
    ), subscribed[0].getMessage()


def test_consumer_stats_have_these_fields() -> None:
    """What every runtime's ``stats()`` says (one class for all of them): a field added or
    renamed changes dashboards and the metrics exporter, so it is written down here."""
    assert [f.name for f in fields(ConsumerStats)] == [
        "topic",
        "channel",
        "received",
        "finished",
        "requeued",
        "given_up",
        "taken_back",
        "in_flight",
        "rdy",
        "max_in_flight",
        "backoff_level",
        "backoff_phase",
        "backoff_windows",
        "reconnects",
        "connection_errors",
        "connections",
        "paused",
        "topic_not_found",
    ]


@pytest.mark.anyio
async def test_stats_speak_one_vocabulary(runtime: Runtime, nsqd: EmbeddedNSQD) -> None:
    topic = unique()
    closed = "127.0.0.1:1"
    async with runtime.producer([nsqd.tcp_address, closed], connect_timeout=1.0) as p:
        await _call(runtime, p.client.connect)
        await p.publish(topic, b"x")
        producer_stats = p.stats()
    async with runtime.consumer(topic, "c", nsqd=[nsqd.tcp_address]) as c:
        message = await c.get(10)
        assert message is not None
        consumer_stats = c.stats()
    assert {conn.state for conn in consumer_stats.connections} == {"subscribed"}
    assert consumer_stats.connected == 1 and consumer_stats.backoff_phase == "normal"
    assert consumer_stats.backoff_level == 0 and consumer_stats.backoff_windows == 0
    by_address = {conn.address: conn for conn in producer_stats.connections}
    assert by_address[nsqd.tcp_address].state == "ready"
    assert by_address[nsqd.tcp_address].connected
    # an address that refuses is "closed", or "connecting" while its next attempt is under way
    assert by_address[closed].state in ("closed", "connecting")
    assert not by_address[closed].connected
    assert "connection refused" in (by_address[closed].last_error or "")
    for conn in (*consumer_stats.connections, *producer_stats.connections):
        assert conn.state in CONNECTION_STATES
