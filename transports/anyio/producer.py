"""The anyio TCP producer: a pool over several nsqd, pipelined (HTTP: ``http.py``).

:class:`Producer` keeps one connection per nsqd, opened on first use. Publishes go round-robin
over the nodes that are up; many are in flight on one connection at once and their answers
are matched in order by the core (:class:`~nsq_sansio.connection.ClientConnection`). When a
connection breaks, the publishes it had not confirmed are retried on the next node (so a
publish is at-least-once, like every NSQ publish); an error answer from nsqd (``E_BAD_TOPIC``,
``E_PUB_FAILED``...) is raised as is, for that publish only. Back-pressure: at most
``max_pending`` publishes wait for their answer; the next ``await publish(...)`` waits for a
slot, nothing buffers without bound.

Cost per publish: no cancel scope and no :class:`anyio.Event`. A waiting publish parks on the
cheapest primitive of the running loop (an asyncio future, or trio's
``wait_task_rescheduled``: see ``_backend.py``); one writer task per connection sends
everything queued since it last ran in one write; one timer task enforces every publish's
deadline and the heartbeat checks. PUBs to one topic that tasks make in the same loop pass,
while others are in flight, go out as one MPUB (``coalesce``, see :class:`Producer`): one
write and one answer for nsqd instead of one each.
The connections themselves (handshake, reads, writes, teardown) are in ``_producer_io.py``.
"""

from __future__ import annotations

import itertools
import logging
from collections import deque
from collections.abc import Awaitable, Callable, Sequence
from time import monotonic
from types import TracebackType
from typing import Any

import anyio
import anyio.abc
import anyio.streams.tls

from nsq_sansio.config import Config
from nsq_sansio.connection import ClientConnection, ConnectionState
from nsq_sansio.errors import (
    ConfigError,
    ConnectionLost,
    IncompatibleNSQD,
    LocalProtocolError,
    NoNSQDAvailable,
    NSQError,
    ServerError,
)
from nsq_sansio.events import ConnectionClosed
from transports._common import (
    DEFAULT_TCP_PORT,
    ConnectionLogger,
    ConnectionStats,
    ProducerStats,
    check_connections_per_nsqd,
    format_address,
    parse_address,
    split_options,
)
from transports._common.arguments import check_seconds
from transports._common.failures import (
    at_address,
    check_enter_once,
    closed_unanswered,
    no_answer,
    no_slot,
    seconds,
)
from transports._common.logs import fields
from transports._common.publishing import (
    PublishObserver,
    check_batch,
    check_deferred,
    check_publish,
)

from ._backend import Backend, current_backend
from ._groups import sole_error
from ._producer_io import Call, Node, NotRead, ProducerConnections, SendAlone

__all__ = ["NoNSQDAvailable", "Producer", "PublishObserver"]

_log = logging.getLogger("nsq_sansio.anyio.producer")


_PUB, _MPUB, _DPUB = 0, 1, 2
_KINDS = ("PUB", "MPUB", "DPUB")
#: ``errors`` of a publish until it has one (no list per publish); never appended to.
_NO_ERRORS: list[BaseException] = []


class Producer(ProducerConnections):
    """Publish to one or several nsqd over TCP; use as ``async with``.

    Keyword arguments are Config fields (``snappy``, ``deflate``, ``auth_secret``,
    ``heartbeat_interval``...) or transport options (``connect_timeout``, ``tls=...``,
    ``tls_ca_file=...``). ``timeout`` bounds one publish (waiting for the answer included);
    when no nsqd can be connected, a publish fails within ``connect_timeout`` instead
    (:class:`~nsq_sansio.errors.NoNSQDAvailable`), and :meth:`connect` checks that at start-up.
    ``publish_observer(topic, messages, seconds, error)``, if given, is called once per
    PUB/MPUB/DPUB when it completes (for metrics; it must not block).
    ``connections_per_nsqd`` opens that many connections to each nsqd and spreads the
    publishes over them (see docs/producers.md for when it helps). With ``coalesce`` (the
    default), PUBs to one topic that concurrent callers make in one loop pass, while others
    are in flight, go out as one MPUB; each is still answered, or refused, on its own.
    ``coalesce=False`` writes one PUB per publish.
    """

    def __init__(
        self,
        nsqd: str | Sequence[str] = "127.0.0.1:4150",
        *,
        config: Config | None = None,
        max_pending: int = 10_000,
        timeout: float = 30.0,
        logger: logging.Logger | None = None,
        publish_observer: PublishObserver | None = None,
        connections_per_nsqd: int = 1,
        coalesce: bool = True,
        **options: Any,
    ) -> None:
        addresses = [nsqd] if isinstance(nsqd, str) else list(nsqd)
        if not addresses:
            raise ConfigError("Producer needs at least one nsqd address")
        if isinstance(max_pending, bool) or not isinstance(max_pending, int) or max_pending < 1:
            raise ConfigError(f"max_pending={max_pending!r} must be an int >= 1")
        check_seconds("Producer timeout", timeout, zero=False, error=ConfigError)
        check_connections_per_nsqd(connections_per_nsqd)
        if not isinstance(coalesce, bool):
            raise ConfigError(f"coalesce={coalesce!r} must be True or False")
        #: PUBs that concurrent callers queue in one loop pass go out as one MPUB.
        self._coalesce = coalesce
        self._config, self._options = split_options(config, options)
        self._logger = logger or _log
        #: One node per connection: ``connections_per_nsqd`` for each nsqd address.
        self._nodes = []
        for address in addresses:
            host, port = parse_address(address, DEFAULT_TCP_PORT)
            for _ in range(connections_per_nsqd):
                self._nodes.append(
                    Node(host, port, ConnectionLogger(self._logger, format_address(host, port)))
                )
        #: Distinct nsqd (failover tries each once, plus one resend after a reconnect).
        self._nsqd_count = len({node.address for node in self._nodes})
        self._timeout = timeout
        self._free = max_pending
        #: Cancelled callers' publishes written and still awaiting their answer (slot freed).
        self._orphans = 0
        self._slot_waiters: deque[anyio.Event] = deque()
        self._timer_started = False
        self._max_pending = max_pending
        self._rr = itertools.count()
        self._tg: anyio.abc.TaskGroup | None = None
        #: The running loop's fast paths (set by __aenter__).
        self._backend: Backend | None = None
        self._call_soon: Callable[..., object] | None = None  # asyncio's (None on trio)
        self._park: Callable[[Call], Awaitable[BaseException | None]] = _not_started
        self._wake: Callable[[Any, BaseException | None], None] = _never
        self._closed = False
        #: close() gave up waiting and closed the connections: what is left fails, nothing
        #: is sent again and nothing reconnects.
        self._shut = False
        self._exited = False
        self._published = 0
        self._failed = 0
        self._retried = 0
        self._valid_topics: set[str] = set()
        #: Called once per publish request when it completes; None costs nothing.
        self.publish_observer: PublishObserver | None = publish_observer

    # --- lifecycle -----------------------------------------------------------------------------

    async def __aenter__(self) -> Producer:
        # Entered once: a second task group would be left open behind the first block's end
        # (trio reports that as a corrupted nursery stack), and the inner block's end would
        # close the producer under the outer one.
        check_enter_once(self._closed, self._tg is not None, "async with")
        backend = self._backend = current_backend()
        self._call_soon = backend.call_soon
        self._park = backend.park
        self._wake = backend.wake
        self._tg = anyio.create_task_group()
        await self._tg.__aenter__()
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        # The block's exception (or cancellation) is never handed to the task group, which
        # would wrap it in an exception group: it goes on as itself, its traceback intact.
        tg = self._tg
        if tg is None or self._exited:
            return
        self._exited = True
        try:
            await self.close()
        finally:
            tg.cancel_scope.cancel()
            try:
                await tg.__aexit__(None, None, None)
            except BaseException as raised:  # our tasks never raise; a cancellation might
                error = sole_error(raised)
                if error is None or error is raised:
                    raise
                raise error from None

    async def connect(self, timeout: float | None = None) -> None:
        """Connect to every nsqd of the pool now, and return once one is ready (the others go
        on connecting); raise :class:`~nsq_sansio.errors.NoNSQDAvailable` (each address's
        cause) when none could be connected within ``timeout`` (default ``connect_timeout``),
        or the configuration's error when an nsqd refused it. For a service that must not
        start without nsqd; publishing connects by itself otherwise."""
        if timeout is not None:
            check_seconds("connect timeout", timeout, zero=False)
        self._check_open()
        limit = self._options.connect_timeout if timeout is None else timeout
        wait = float("inf") if timeout is None else timeout  # attempts end by connect_timeout
        nodes = self._candidates()
        errors: dict[str, BaseException] = {}
        ready = anyio.Event()

        async def attempt(node: Node) -> None:
            try:
                await self._ensure(node)
            except IncompatibleNSQD as exc:
                errors[node.address] = exc
            except (NSQError, OSError) as exc:
                errors[node.address] = exc
            else:
                ready.set()
                return
            if len(errors) == len(nodes):
                ready.set()

        async with anyio.create_task_group() as tg:
            for node in nodes:
                tg.start_soon(attempt, node)
            with anyio.move_on_after(wait):
                await ready.wait()
            tg.cancel_scope.cancel()
        if any(node.ready for node in self._nodes):
            return
        for error in errors.values():
            if isinstance(error, IncompatibleNSQD):
                raise error
        for node in nodes:
            if node.address not in errors:
                errors[node.address] = ConnectionLost(
                    f"{node.address}: not connected within {seconds(limit)}"
                )
        raise NoNSQDAvailable(list(errors.values()), what="a connection")

    def _check_open(self) -> None:
        if self._closed:
            raise LocalProtocolError("the producer is closed")
        if self._tg is None:
            raise LocalProtocolError("use the Producer as `async with Producer(...) as p:`")

    @property
    def config(self) -> Config:
        """The configuration every connection of this producer identifies with."""
        return self._config

    async def close(self, timeout: float | None = 10.0) -> None:
        """Wait (up to ``timeout``) for the publishes under way, then close every connection:
        those still unanswered fail with ConnectionLost, and are not sent again."""
        if timeout is not None:
            check_seconds("close timeout", timeout)
        self._closed = True
        if self._tg is None:
            return  # never started: no connection to close
        with anyio.CancelScope(shield=True):
            with anyio.move_on_after(timeout if timeout is not None else float("inf")):
                # A publish under way holds a slot (connecting, written, waiting for its turn);
                # a cancelled one's answer is awaited too (it is still pending on its node).
                while (
                    self._free < self._max_pending
                    or self._slot_waiters
                    or any(node.pending or node.turns for node in self._nodes)
                ):
                    await anyio.sleep(0.005)
            self._shut = True
            for node in self._nodes:
                self._disconnect(node, ConnectionLost("producer closed"), node.generation)

    # --- publishing ----------------------------------------------------------------------------

    async def publish(self, topic: str, body: bytes) -> None:
        """``PUB``: returns once nsqd confirmed it."""
        if topic not in self._valid_topics or type(body) is not bytes or not body:
            check_publish(self._valid_topics, topic, body)
        await self._request(_PUB, topic, body, 1)

    async def multi_publish(self, topic: str, bodies: Sequence[bytes]) -> None:
        """``MPUB``: all or nothing, one answer."""
        batch = check_batch(self._valid_topics, topic, bodies)
        await self._request(_MPUB, topic, batch, len(batch))

    async def deferred_publish(self, topic: str, body: bytes, delay: float) -> None:
        """``DPUB``: deliverable after ``delay`` seconds."""
        check_deferred(self._valid_topics, topic, body, delay, self._config.max_req_timeout)
        await self._request(_DPUB, topic, (body, delay), 1)

    def _candidates(self) -> list[Node]:
        """One connection per nsqd (a connected one first), starting at the next in turn:
        those up (or not known to be down) first, then the rest as a last resort."""
        start = next(self._rr) % len(self._nodes)
        ordered = self._nodes[start:] + self._nodes[:start]
        now = monotonic()
        best: dict[str, Node] = {}
        for n in ordered:
            other = best.get(n.address)
            if other is None or (other.down_until > now, not other.ready) > (
                n.down_until > now,
                not n.ready,
            ):
                best[n.address] = n
        return [n for n in best.values() if n.down_until <= now] + [
            n for n in best.values() if n.down_until > now
        ]

    def _others(self, node: Node) -> list[Node]:
        """Failover targets after ``node`` failed: one connection of every other nsqd."""
        return [n for n in self._candidates() if n.address != node.address]

    async def _request(self, kind: int, topic: str, payload: Any, count: int) -> None:
        """Send the request, failing over to other nodes while connections break, and wait
        for its answer (one coroutine: this is the hot path of every publish)."""
        if self._tg is None or self._closed:
            self._check_open()
        start = monotonic()
        # Back-pressure without a checkpoint per publish while slots are free.
        if self._free > 0:
            self._free -= 1
        else:
            try:
                got = False
                with anyio.move_on_after(self._timeout):  # the call's deadline covers the wait
                    await self._wait_for_slot()
                    got = True
                if not got:
                    raise no_slot(self._max_pending, self._timeout)
            except BaseException as exc:
                observer = self.publish_observer
                if observer is not None:
                    self._observe(observer, topic, count, start, exc)
                raise
        call = Call(_KINDS[kind], topic, count, start, start + self._timeout)
        try:
            nodes = self._nodes
            node = nodes[0] if len(nodes) == 1 else nodes[next(self._rr) % len(nodes)]
            # Up, or not known to be down (never tried, or nsqd closed it over a refused
            # publish): it takes the publish in its turn (connected first), so a pool spreads
            # out again; else one connection of each nsqd, those not known to be down first.
            candidates = [node] if node.ready or node.down_until <= start else self._candidates()
            errors: list[BaseException] = _NO_ERRORS  # a list of its own on the first one
            sent = 0
            coalesce = self._coalesce
            i = 0
            again = False  # the same node again, for a reason that is no retry
            while i < len(candidates):
                node = candidates[i]
                i += 1
                if errors and not again:
                    self._retried += 1
                again = False
                proto = node.proto
                if not node.ready or proto is None:
                    if self._shut:
                        self._failed += 1
                        raise closed_unanswered(call.kind, topic, sent=sent > 0)
                    try:
                        # A connection attempt ends within connect_timeout; the publish's own
                        # deadline may come first.
                        proto = None
                        with anyio.move_on_after(max(call.deadline - monotonic(), 0)):
                            proto = await self._ensure(node)
                        if proto is None:
                            raise ConnectionLost(
                                f"{node.address}: not connected when the publish timed out "
                                f"after {seconds(self._timeout)}"
                            )
                    except IncompatibleNSQD:
                        self._failed += 1
                        raise  # the configuration's fault: no other node will take it either
                    except NSQError as exc:
                        if self._shut:  # closed while connecting
                            self._failed += 1
                            raise closed_unanswered(call.kind, topic, sent=sent > 0) from None
                        if errors is _NO_ERRORS:
                            errors = []
                        errors.append(at_address(node.address, exc))
                        if len(candidates) == 1 and self._nsqd_count > 1:
                            candidates = [node, *self._others(node)]
                        continue
                # A node that lost a connection in a reset with publishes unanswered sends one
                # at a time (see ``_await_turn``): a suspect, or any publish while it has some.
                alone = node.suspects or call.suspect
                if alone:
                    if call.suspect and call.bound is not node:
                        self._bind(call, node)
                    if node.pending or node.turns or node.granted:
                        try:
                            taken = await self._await_turn(node, proto, call)
                        except TimeoutError:
                            self._failed += 1
                            raise
                        if not taken:  # its connection went meanwhile: after a reconnect
                            i -= 1
                            again = True
                            continue
                        alone = node.suspects or call.suspect
                try:
                    if kind == _PUB:
                        request_id = proto.publish(topic, payload, coalesce and not alone)
                    elif kind == _MPUB:
                        request_id = proto.multi_publish(topic, payload)
                    else:
                        request_id = proto.deferred_publish(topic, payload[0], payload[1])
                except LocalProtocolError:
                    if proto.state is not ConnectionState.CLOSED:
                        self._failed += 1
                        raise  # the arguments are wrong, not the connection
                    # The connection died and its task has not yet been told: treat as lost.
                    self._disconnect(node, ConnectionLost("connection closed"), node.generation)
                    if errors is _NO_ERRORS:
                        errors = []
                    errors.append(ConnectionLost(f"{node.address}: connection closed"))
                    if i >= len(candidates) and sent <= self._nsqd_count:
                        candidates.append(node)
                    continue
                if call.done:  # a resend: the last attempt's outcome is not this one's
                    call.done = False
                    call.result = None
                sent += 1
                node.pending[request_id] = call
                self._send_soon(node, proto)
                # Park until the reader, the timer or a disconnect resolves the call.
                if call.done:
                    error = call.result
                else:
                    parked = self._park(call)
                    try:
                        error = await parked
                    except BaseException:
                        self._backend.unpark(call)  # type: ignore[union-attr]
                        raise
                if call.bound is not None:
                    self._unbind(call)
                if error is None:
                    node.published += 1
                    self._published += 1
                    break
                if isinstance(error, ServerError | TimeoutError):
                    self._failed += 1
                    raise error
                if self._shut:  # close() gave up on it: failed, never sent again
                    self._failed += 1
                    raise closed_unanswered(call.kind, topic, sent=True) from None
                if isinstance(error, NotRead):
                    sent -= 1
                    self._retried += 1
                    if type(error) is SendAlone:
                        coalesce = False  # its coalesced MPUB was refused: on its own now
                    candidates.append(node)  # nsqd never read it: the same node again
                    continue
                if errors is _NO_ERRORS:
                    errors = []
                errors.append(at_address(node.address, error))
                if len(candidates) == 1 and self._nsqd_count > 1:
                    candidates = [node, *self._others(node)]
                if i >= len(candidates) and sent <= self._nsqd_count:
                    # The connection died with this publish unanswered, maybe not the node
                    # (nsqd closes it after a fatal error for another publish pipelined
                    # before ours, which it then never read): send it again after a
                    # reconnect, like the blocking producer (at most one more send).
                    candidates.append(node)
            else:
                self._failed += 1
                raise NoNSQDAvailable(errors)
        except BaseException as exc:
            if call.bound is not None:
                self._unbind(call)
            if call.orphan:
                self._orphans += 1  # until its answer comes (``_resolve``)
            self._release_slot()
            observer = self.publish_observer
            if observer is not None and not call.orphan:  # an orphan is observed on its answer
                self._observe(observer, topic, count, start, exc)
            raise
        self._release_slot()
        observer = self.publish_observer
        if observer is not None:
            self._observe(observer, topic, count, start, None)

    # --- after a reset: one publish at a time -------------------------------------------------

    def _bind(self, call: Call, node: Node) -> None:
        """``call`` (a suspect) goes to ``node`` next: the node sends alone until it is sent."""
        if call.bound is not None:
            self._unbind(call)
        call.bound = node
        node.suspects += 1

    def _unbind(self, call: Call) -> None:
        """``call``'s send alone was answered (or it ended): its node may pipeline again."""
        node = call.bound
        assert node is not None
        call.bound = None
        node.suspects -= 1
        if not node.suspects:
            # Pipelining again: whoever waits for a turn goes now (with nothing else in
            # flight; they see ``suspects`` is 0 and do not wait again).
            turns = node.turns
            while turns:
                turns.popleft().set()
            node.granted = False

    async def _await_turn(self, node: Node, proto: ClientConnection, call: Call) -> bool:
        """Wait, up to ``call``'s deadline (TimeoutError), until ``call`` may be sent alone on
        ``node``: nothing else in flight there, and the waiters before it served. Why: after
        nsqd refused a publish with others pipelined behind it unread, its close resets the
        connection, and the reset may destroy answers nsqd had written; a publish sent alone
        is refused with nsqd's answer, or stored, whoever else is faulty. False: the
        connection went meanwhile (send after a reconnect)."""
        turn = anyio.Event()
        node.turns.append(turn)
        while True:
            try:
                with anyio.move_on_after(max(call.deadline - monotonic(), 0)):
                    await turn.wait()
            except BaseException:
                if turn.is_set():  # handed the turn while cancelled: pass it on
                    node.granted = False
                    self._next_turn(node)
                else:
                    node.turns.remove(turn)
                raise
            if not turn.is_set():
                node.turns.remove(turn)
                raise no_answer(call.kind, call.topic, node.address, self._timeout)
            node.granted = False
            if node.proto is not proto or not node.ready:
                self._next_turn(node)
                return False
            if not node.pending or not (node.suspects or call.suspect):
                return True
            # Released when the node stopped sending alone, and it started again meanwhile.
            turn = anyio.Event()
            node.turns.appendleft(turn)

    def _observe(
        self,
        observer: PublishObserver,
        topic: str,
        count: int,
        start: float,
        error: BaseException | None,
    ) -> None:
        try:
            observer(topic, count, monotonic() - start, error)
        except Exception:
            self._logger.exception("publish_observer failed", extra=fields(topic=topic))

    def _resolve(self, call: Call, error: BaseException | None) -> None:
        """Hand ``call`` its outcome (None: nsqd said OK) and wake its caller."""
        if call.orphan:
            self._orphans -= 1
            observer = self.publish_observer
            if observer is not None:
                self._observe(observer, call.topic, call.count, call.start, error)
            return
        call.done = True
        call.result = error
        waker = call.waker
        if waker is None:
            return  # not parked yet: it finds the result itself
        call.waker = None
        self._wake(waker, error)

    # --- writing -------------------------------------------------------------------------------

    def _send_soon(self, node: Node, proto: ClientConnection) -> None:
        """Get what ``proto`` queued onto the wire: now when nothing else is waiting for an
        answer (the one-by-one case: no task switch), else once for everything queued in this
        loop iteration."""
        if node.sock is not None and len(node.pending) == 1 and not node.out:
            self._write_now(node, proto)
        elif not node.flush_scheduled:
            node.flush_scheduled = True
            if self._call_soon is not None and node.sock is not None:
                self._call_soon(self._flush_scheduled, node, proto)
            elif not node.wake_set:
                node.wake_set = True
                node.wake.set()

    def _flush_scheduled(self, node: Node, proto: ClientConnection) -> None:
        node.flush_scheduled = False
        if node.proto is proto:
            self._write_now(node, proto)

    def _write_now(self, node: Node, proto: ClientConnection) -> None:
        """Plain TCP: write what ``proto`` queued straight to the socket; what the kernel does
        not take now waits in ``node.out`` for the writer task."""
        data = proto.data_to_send()
        if not data:
            return
        node.bytes_out += len(data)
        if node.out:
            node.out += data
            return
        sock = node.sock
        assert sock is not None
        try:
            sent = sock.send(data)
        except (BlockingIOError, InterruptedError):
            sent = 0
        except OSError as exc:
            self._send_failed(node, proto, exc, node.generation)
            return
        if sent < len(data):
            node.out += memoryview(data)[sent:]
            if not node.wake_set:
                node.wake_set = True
                node.wake.set()

    async def _wait_for_slot(self) -> None:
        event = anyio.Event()
        self._slot_waiters.append(event)
        try:
            await event.wait()
        except BaseException:
            if event.is_set():  # the slot was handed to us: pass it on
                self._release_slot()
            else:
                self._slot_waiters.remove(event)
            raise

    def _release_slot(self) -> None:
        if self._slot_waiters:
            self._slot_waiters.popleft().set()  # hand the slot over directly
        else:
            self._free += 1

    async def _timer(self) -> None:
        """Fail publishes unanswered past their deadline and close connections whose
        heartbeats stopped: one timer for the whole producer, not one per call or read."""
        tick = min(max(self._timeout / 4, 0.01), 1.0)
        while True:
            await anyio.sleep(tick)
            now = monotonic()
            for node in self._nodes:
                proto = node.proto
                if proto is not None and node.ready:
                    deadline = proto.next_deadline()
                    if deadline is not None and now >= deadline:
                        for event in proto.handle_timer(now):
                            if isinstance(event, ConnectionClosed):
                                error = event.error or ConnectionLost("heartbeats stopped")
                                self._disconnect(node, error, node.generation)
                if not node.pending:
                    continue
                expired = [rid for rid, call in node.pending.items() if now >= call.deadline]
                for request_id in expired:
                    call = node.pending.pop(request_id)
                    self._resolve(
                        call, no_answer(call.kind, call.topic, node.address, self._timeout)
                    )
                if node.turns and not node.pending:
                    self._next_turn(node)

    # --- stats ---------------------------------------------------------------------------------

    def stats(self) -> ProducerStats:
        """A snapshot of the counters and connections. Safe to call from another thread (a
        metrics scrape) while the event loop runs: it only reads fields and sizes."""
        return ProducerStats(
            published=self._published,
            failed=self._failed,
            # publishes holding a slot (connecting, written or waiting to be) and cancelled
            # ones still awaiting their answer: what the blocking producer counts too
            pending=self._max_pending - self._free + self._orphans,
            reconnects=sum(max(n.connects - 1, 0) for n in self._nodes),
            connections=tuple(
                ConnectionStats(
                    address=n.address,
                    state=n.state,
                    connected=n.ready,
                    in_flight=len(n.pending),
                    reconnects=max(n.connects - 1, 0),
                    bytes_received=n.bytes_in,
                    bytes_sent=n.bytes_out,
                    last_error=n.last_error,
                )
                for n in self._nodes
            ),
        )

    @property
    def retried(self) -> int:
        """Publishes sent again to another nsqd after a connection failure."""
        return self._retried


async def _not_started(call: Call) -> BaseException | None:
    raise LocalProtocolError("the producer is not started (use async with)")


def _never(waker: Any, error: BaseException | None) -> None:
    """No task is parked before the producer is started."""
