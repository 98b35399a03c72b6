"""Callers that read their own answers: the blocking producer's direct path.

A thread that published on a plain TCP connection does not wait for the IO thread to read the
answer: it writes its command itself and, while the connection is "direct", one waiting caller
at a time (the leader) reads the socket and completes every answer it finds, then hands the
read role to another waiting caller or back to the IO thread. :class:`CallerReads` is that
part of :class:`~transports.sync.producer.Producer` (its base class); when the IO thread lends
the socket and takes it back (``_enter_direct``, ``_check_direct``) stays in ``producer.py``.
"""

from __future__ import annotations

import functools
import itertools
import logging
import threading
import time
from _thread import allocate_lock as _allocate_lock
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from nsq_sansio.connection import ClientConnection
from nsq_sansio.errors import (
    NSQError,
)
from nsq_sansio.events import (
    ConnectionClosed,
    Heartbeat,
    PublishAcknowledged,
    PublishFailed,
)
from transports._common import READ_SIZE

from ._loop import IOLoop, LoopSocket
from ._producer_records import Node, Request, Wire

__all__ = ["CallerReads"]

_log = logging.getLogger("nsq_sansio.sync.producer")
#: The most inflight requests looked at for a waiting caller to hand the read role to.
_HANDOFF_SCAN = 64


class CallerReads:
    """The callers' side of a direct connection (a base class of ``Producer``)."""

    # What it uses of the producer (set by Producer.__init__):
    _io_lock: threading.RLock
    _loop: IOLoop
    _published: int
    _wakes: list[Any] | None

    if TYPE_CHECKING:

        def _complete(self, request: Request, error: BaseException | None) -> None: ...

        def _fail_request(self, request: Request, error: BaseException) -> None: ...

        def _on_closed(self, node: Node, error: BaseException | None, now: float) -> None: ...

        def _on_link_error(self, link: LoopSocket, error: BaseException, now: float) -> None: ...

        def _retire(self, wire: Wire) -> None: ...

        def _unuse(self, wire: Wire) -> None: ...

        def _leave_direct(self, node: Node, wire: Wire) -> None: ...

        def _locked(self, fn: Callable[..., None], *args: Any) -> None: ...

        def _refused(self, node: Node, event: PublishFailed) -> None: ...

    def _take_output(self, node: Node, wire: Wire, conn: ClientConnection) -> bytes:
        """Lock held: what ``conn`` queued, with the writer role, when it is free (else b"")."""
        if wire.sending or wire.retired or node.out_pending:
            return b""
        link = node.link
        if link is None or link.out:
            return b""
        data = conn.data_to_send()
        if data:
            wire.sending = True
            wire.users += 1
        return data

    def _write_direct(self, node: Node, wire: Wire, conn: ClientConnection, data: bytes) -> None:
        """Holding ``wire.sending``: send ``data``, then whatever others queued meanwhile, on
        this thread; what the kernel does not take goes to the IO thread."""
        send = wire.sock.send
        lock = self._io_lock
        while True:
            try:
                sent = send(data)
            except OSError:  # would block, or broken: the IO thread takes it from here
                sent = 0
            with lock:
                if wire.retired or node.conn is not conn:
                    wire.sending = False
                    self._unuse(wire)
                    return  # the connection died meanwhile: its bytes go with it
                link = node.link
                assert link is not None
                link.bytes_out += sent
                if sent < len(data):
                    node.out_pending[:0] = memoryview(data)[sent:]
                    wire.sending = False
                    self._unuse(wire)
                    self._loop.wake()
                    return
                data = conn.data_to_send()
                if not data:
                    wire.sending = False
                    self._unuse(wire)
                    return

    def _await(self, request: Request, timeout: float | None, parked: bool = False) -> None:
        """Wait until ``request`` is done, or ``timeout`` (TimeoutError): reading its
        connection when no other thread does, else parked until its answer is in (or the read
        role is handed to it). ``parked``: already registered as waiting (``_dispatch_now``)."""
        until = None if timeout is None else time.monotonic() + max(timeout, 0.0)
        lock = self._io_lock
        waiter = request._waiter if parked else None
        while True:
            if waiter is None:
                lead = False
                write = b""
                conn: ClientConnection | None = None
                with lock:
                    if request._done or (until is not None and time.monotonic() >= until):
                        self._drop_role(request)
                        if request._done:
                            return
                        raise TimeoutError(f"no answer from nsqd within {timeout}s")
                    node = request.node
                    wire = node.wire if node is not None else None
                    if node is not None and wire is not None and not wire.retired:
                        conn = node.conn
                        assert conn is not None
                        if wire.direct:
                            if wire.leader is None or wire.leader is request:
                                request.promoted = None
                                wire.leader = request
                                wire.users += 1
                                lead = True
                        else:
                            wire.want_direct = True  # the IO thread hands the reads over
                        if wire.leader is None or lead:
                            # What publish_async left queued (a leader writes the rest).
                            write = self._take_output(node, wire, conn)
                    if not lead and not write:
                        waiter = request._waiter
                        if waiter is None:
                            waiter = request._waiter = _allocate_lock()
                            waiter.acquire()
                        request.waiting += 1
                if write:
                    assert node is not None and wire is not None and conn is not None
                    self._write_direct(node, wire, conn, write)
                if lead:
                    assert node is not None and wire is not None
                    self._lead(node, wire, request, until)
                if waiter is None:
                    continue
            if until is None:
                got = waiter.acquire()
            else:
                remaining = until - time.monotonic()
                got = waiter.acquire(True, remaining) if remaining > 0 else waiter.acquire(False)
            if got and request._done and request.promoted is None:  # no lock needed
                waiter.release()  # let any other thread waiting for it through
                return
            with lock:
                request.waiting -= 1
                if got or request._signaled:
                    if not got:  # released between our time-out and now: take it back
                        waiter.acquire(False)
                    request._signaled = False
                if request._done or not got:
                    self._drop_role(request)
                if request._done:
                    request._signaled = True
                    waiter.release()
                    return
                if not got:
                    raise TimeoutError(f"no answer from nsqd within {timeout}s")
            waiter = None  # woken without an answer: handed the read role, or moved

    def _lead(self, node: Node, wire: Wire, request: Request, until: float | None) -> None:
        """Holding the read role of ``node``'s connection: read and dispatch answers, and
        write what other callers queued meanwhile, until ``request``'s own answer is in, its
        deadline or ``until`` passes, or the connection goes."""
        conn = node.conn
        link = node.link
        assert conn is not None and link is not None
        poll = wire.poll
        recv = wire.sock.recv
        lock = self._io_lock
        monotonic = time.monotonic
        deadline = request.deadline
        limit = deadline if until is None or until > deadline else until
        wakes: list[Any] | None = None
        while True:
            wait = limit - monotonic()
            data = None
            error: OSError | None = None
            if wait > 0:
                try:
                    ready = poll(int(wait * 1000) + 1)
                except OSError as exc:  # pragma: no cover - EINTR is retried by Python
                    ready, error = [], exc
                if ready:
                    try:
                        data = recv(READ_SIZE)
                    except (BlockingIOError, InterruptedError):
                        pass
                    except OSError as exc:
                        error = exc
            stop = True
            with lock:
                if wire.retired or wire.leader is not request or node.conn is not conn:
                    pass
                elif error is not None:
                    self._lost_by_caller(node, wire, link, error)
                else:
                    now = monotonic()
                    if data is not None:
                        link.bytes_in += len(data)
                        self._wakes = wakes = []
                        try:
                            self._feed(node, wire, conn, data, now)
                        finally:
                            self._wakes = None
                    if request._done or wire.retired:
                        pass
                    elif now >= deadline:
                        self._expire(node, request, now)
                    elif until is None or now < until:
                        stop = False
                out = self._take_output(node, wire, conn)
                if stop:
                    self._unuse(wire)
                    if wire.leader is request:
                        self._release_lead(node, wire)
            if wakes:
                for waiter in wakes:
                    waiter.release()
                wakes = None
            if out:
                self._write_direct(node, wire, conn, out)
            if stop:
                return

    def _feed(
        self, node: Node, wire: Wire, conn: ClientConnection, data: bytes, now: float
    ) -> None:
        """A leader's read (lock held): answers complete their publishes here; what needs the
        IO loop (a closed connection, a NOP to write) is handed to the IO thread."""
        inflight = node.inflight
        for event in conn.receive_data(data, now):
            if type(event) is PublishAcknowledged:
                request = inflight.pop(event.request_id, None)
                if request is not None and not request._done:
                    node.published += 1
                    self._published += 1
                    self._complete(request, None)
            elif isinstance(event, PublishFailed):
                self._refused(node, event)
            elif type(event) is Heartbeat:
                self._loop.wake()  # the IO thread writes the NOP the core queued
            elif isinstance(event, ConnectionClosed):
                node.ready = False  # nothing more goes there; the IO thread tears it down
                self._retire(wire)
                self._loop.call_soon(
                    functools.partial(self._locked, self._closed_by_caller, node, conn, event.error)
                )

    def _lost_by_caller(self, node: Node, wire: Wire, link: LoopSocket, error: OSError) -> None:
        """A leader's read failed (lock held): the IO thread tears the connection down."""
        node.ready = False
        self._retire(wire)
        self._loop.call_soon(
            lambda: self._locked(self._on_link_error, link, error, time.monotonic())
        )

    def _closed_by_caller(self, node: Node, conn: ClientConnection, error: NSQError | None) -> None:
        if node.conn is conn:
            self._on_closed(node, error, time.monotonic())

    def _expire(self, node: Node, request: Request, now: float) -> None:
        """Fail ``request`` (lock held) for its deadline; it stays known to the core, which
        matches nsqd's late answer to it (and drops it)."""
        for request_id, pending in node.inflight.items():
            if pending is request:
                del node.inflight[request_id]
                break
        self._fail_request(
            request,
            TimeoutError(
                f"{request.kind} to {request.topic!r}: no answer from {node.address} "
                f"within {request.deadline - request.start:g}s"
            ),
        )

    def _release_lead(self, node: Node, wire: Wire) -> None:
        """Give up the read role (lock held): to the oldest caller waiting for an answer on
        this connection; with publishes in flight and nobody waiting, to the IO thread."""
        wire.leader = None
        wire.lead_end = time.monotonic()
        if wire.broken is not None and not wire.retired:
            self._loop.call_soon(lambda: self._locked(self._finish_broken, node, wire))
            return
        if wire.retired or not node.inflight:
            return
        successor = self._waiter_of(node)
        if successor is not None:
            self._hand_role(node, wire, successor)
        else:
            self._loop.call_soon(lambda: self._locked(self._ensure_reader, node))

    def _finish_broken(self, node: Node, wire: Wire) -> None:
        """IO thread: the loop's write failed while a caller read; it left without seeing it."""
        link = node.link
        if node.wire is wire and wire.leader is None and link is not None and wire.broken:
            self._on_link_error(link, wire.broken, time.monotonic())

    def _hand_role(self, node: Node, wire: Wire, successor: Request) -> None:
        """Lock held: make ``successor``'s (parked) thread the reader of ``wire``."""
        wire.leader = successor
        successor.promoted = node
        successor._signaled = True
        successor._waiter.release()

    def _drop_role(self, request: Request) -> None:
        """Lock held: ``request``'s thread leaves without taking the read role it was
        handed (its answer came another way, or it gave up): hand it on."""
        node = request.promoted
        if node is not None:
            request.promoted = None
            wire = node.wire
            if wire is not None and wire.leader is request:
                self._release_lead(node, wire)

    def _waiter_of(self, node: Node) -> Request | None:
        """The oldest request in flight on ``node`` that a thread waits for (lock held)."""
        for request in itertools.islice(node.inflight.values(), _HANDOFF_SCAN):
            if request.waiting and not request._signaled:
                return request
        return None

    def _ensure_reader(self, node: Node) -> None:
        """IO thread: answers are expected on ``node`` and no caller reads them: hand the read
        role to a waiting caller, else read them here."""
        wire = node.wire
        if wire is None or not wire.direct or wire.leader is not None or wire.retired:
            return
        if not node.inflight:
            return
        successor = self._waiter_of(node)
        if successor is not None:
            self._hand_role(node, wire, successor)
        else:
            self._leave_direct(node, wire)
