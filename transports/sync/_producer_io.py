"""The blocking producer's IO thread: the :class:`~transports.sync._loop.IOLoop` callbacks.

:class:`ProducerIOThread` is a part of :class:`~transports.sync.producer.Producer` (its base
class) and runs on the IO thread, under the producer's ``_io_lock``: a connection made, data
read (answers matched to their publishes), TLS established, a connection lost (its unanswered
publishes sent again elsewhere), the writes that wait, and the timers (reconnects, publishes
past their deadline, connections callers read). The loop calls them through
:meth:`ProducerIOThread._loop_callbacks` (private methods: they are not the producer's API).
"""

from __future__ import annotations

import os
import random
import socket
import ssl
import threading
from collections import deque
from typing import TYPE_CHECKING

from nsq_sansio.backoff import reconnect_delay
from nsq_sansio.config import Config
from nsq_sansio.connection import ConnectionState
from nsq_sansio.errors import (
    CoalescedPublishRefused,
    ConnectionLost,
    IncompatibleNSQD,
    NoNSQDAvailable,
    ServerError,
)
from nsq_sansio.events import (
    ConnectionClosed,
    ConnectionReady,
    PublishAcknowledged,
    PublishFailed,
    TLSUpgradeRequired,
)
from transports._common import READ_SIZE, TransportOptions
from transports._common.failures import at_address, handshake_timed_out, no_answer, seconds
from transports._common.logs import fields
from transports._common.reports import (
    log_coalesced_refused,
    log_producer_disconnect,
    log_publish_refused,
)

from ._loop import IOLoop, LoopCallbacks, LoopSocket
from ._producer_records import Node, Request, Wire

__all__ = ["ProducerIOThread"]


class ProducerIOThread:
    """The producer's IO-thread side (a base class of ``Producer``)."""

    # What it uses of the producer (set by Producer.__init__):
    _config: Config
    _options: TransportOptions
    _ssl_context: ssl.SSLContext | None
    _nodes: list[Node]
    _io_lock: threading.RLock
    _loop: IOLoop
    _rng: random.Random
    _waiting: deque[Request]
    _closing: bool
    _published: int
    _retried: int
    _expiry_check: float | None
    _expiry_tick: float
    _direct_check: float | None
    _timeout: float

    if TYPE_CHECKING:

        def _complete(self, request: Request, error: BaseException | None) -> None: ...

        def _fail_request(self, request: Request, error: BaseException) -> None: ...

        def _connect(self, node: Node) -> None: ...

        def _dispatch(self, request: Request) -> None: ...

        def _retire(self, wire: Wire) -> None: ...

        def _enter_direct(self, node: Node, wire: Wire) -> None: ...

        def _check_direct(self, now: float) -> None: ...

    def _loop_callbacks(self) -> LoopCallbacks:
        """What the IO loop calls (on its thread)."""
        return LoopCallbacks(
            on_connected=self._io_connected,
            on_data=self._io_data,
            on_link_error=self._io_link_error,
            on_tls_established=self._io_tls_established,
            write_pending=self._io_write_pending,
            next_deadline=self._io_next_deadline,
            handle_timer=self._io_timer,
        )

    def _refused(self, node: Node, event: PublishFailed) -> None:
        """nsqd refused a publish (lock held): it fails with nsqd's error. A PUB refused as a
        member of a coalesced MPUB was not stored and may not be at fault: it stays in
        ``inflight`` marked ``alone``, and when the connection closes (nsqd closes it after any
        publish error) it is sent again as a PUB of its own, like a publish nsqd never read."""
        error = event.error
        inflight = node.inflight
        if isinstance(error, CoalescedPublishRefused):
            request = inflight.get(event.request_id)
            if request is not None:
                if error is not node.last_refused:  # one error object per refused group
                    node.last_refused = error
                    log_coalesced_refused(node.log, request.topic, error.error)
                request.alone = True
            return
        request = inflight.pop(event.request_id, None)
        node.failed += 1
        if request is not None:
            log_publish_refused(node.log, request.kind, request.topic, error)
            self._fail_request(request, error)

    def _node_of(self, link: LoopSocket) -> Node:
        node = link.key
        assert isinstance(node, Node)
        return node

    def _io_connected(self, link: LoopSocket, now: float) -> None:
        pass  # the connection's magic and IDENTIFY are flushed by the loop

    def _io_data(self, link: LoopSocket, data: bytes, now: float) -> None:
        with self._io_lock:
            self._on_data(link, data, now)

    def _on_data(self, link: LoopSocket, data: bytes, now: float) -> None:
        node = self._node_of(link)
        if node.link is not link or node.conn is None:
            return
        for event in node.conn.receive_data(data, now):
            if type(event) is PublishAcknowledged:
                request = node.inflight.pop(event.request_id, None)
                if request is not None and not request._done:
                    node.published += 1
                    self._published += 1
                    self._complete(request, None)
            elif isinstance(event, PublishFailed):
                self._refused(node, event)
            elif isinstance(event, ConnectionReady):
                node.ready = True
                node.ready_by = None
                node.failures = 0
                node.last_error = None
                node.last_exc = None
                node.connects += 1
                if node.connects > 1:
                    node.log.info("reconnected", extra=fields(state="ready"))
                else:
                    node.log.debug("connected", extra=fields(state="ready"))
                if not link.tls:
                    node.wire = self._make_wire(link)
                self._drain_waiting()
            elif isinstance(event, TLSUpgradeRequired):
                assert self._ssl_context is not None
                self._loop.start_tls(
                    link,
                    self._ssl_context,
                    self._options.tls.server_hostname(node.host),
                    event.trailing_data,
                )
            elif isinstance(event, ConnectionClosed):
                self._on_closed(node, event.error, now)
        wire = node.wire
        if wire is not None and wire.want_direct and not wire.direct and not wire.retired:
            self._enter_direct(node, wire)

    def _make_wire(self, link: LoopSocket) -> Wire | None:
        """Plain TCP: a duplicate of the socket for callers to read and write directly."""
        sock = link.sock
        if sock is None:
            return None
        try:
            dup = socket.socket(sock.family, sock.type, sock.proto, fileno=os.dup(sock.fileno()))
        except OSError:
            return None
        dup.setblocking(False)
        return Wire(dup)

    def _io_tls_established(self, link: LoopSocket, now: float) -> None:
        with self._io_lock:
            self._on_tls_established(link, now)

    def _on_tls_established(self, link: LoopSocket, now: float) -> None:
        node = self._node_of(link)
        if node.conn is not None and node.link is link:
            node.conn.tls_established()

    def _io_link_error(self, link: LoopSocket, error: BaseException, now: float) -> None:
        with self._io_lock:
            self._on_link_error(link, error, now)

    def _on_link_error(self, link: LoopSocket, error: BaseException, now: float) -> None:
        node = self._node_of(link)
        if node.link is not link and not node.connecting:
            return
        wire = node.wire
        if wire is not None and not wire.retired:
            # A write failed (nsqd closed the socket): what nsqd sent before it is still
            # readable. Its answers (and the error that made nsqd close) must be matched
            # first, or publishes nsqd stored would be sent again.
            if wire.leader is not None:
                # The caller reading it gets there and reports it (or, leaving first, has
                # the IO thread finish this).
                node.ready = False
                if wire.broken is None:
                    wire.broken = error
                return
            self._read_leftovers(node, wire, link, now)
            if node.link is not link:
                return  # what was read closed it (nsqd's error frame)
        lost = at_address(node.address, error)
        if node.conn is not None and node.conn.state is not ConnectionState.CLOSED:
            # The socket failed under the connection: let the core report what was pending.
            for event in node.conn.receive_data(b"", now):
                if isinstance(event, ConnectionClosed):
                    self._on_closed(node, lost, now)
                    return
        self._on_closed(node, lost, now)

    def _read_leftovers(self, node: Node, wire: Wire, link: LoopSocket, now: float) -> None:
        """IO thread: feed what is left in the socket's receive buffer to the core."""
        while node.link is link and node.conn is not None:
            try:
                data = wire.sock.recv(READ_SIZE)
            except OSError:
                return
            if not data:
                return
            self._on_data(link, data, now)

    def _on_closed(self, node: Node, error: BaseException | None, now: float) -> None:
        # Opened: the handshake ended (``ready_by`` is cleared then), even if ``ready`` was
        # already dropped by a caller's failed read or write.
        opened = node.ready_by is None
        if node.wire is not None:
            self._retire(node.wire)  # wakes a caller reading or writing it
            node.wire = None
        if node.link is not None:
            self._loop.close_link(node.link)
        node.link = None
        node.conn = None
        node.ready = False
        node.ready_by = None
        if self._closing:
            return
        if isinstance(error, IncompatibleNSQD):
            # The configuration's fault: reconnecting cannot help, so nothing retries it.
            # Publishes waiting for a connection fail with it; a later publish tries again.
            node.config_error = error
            node.refused_at = now
            node.last_error = str(error)
            node.last_exc = error
            node.retry_at = float("inf")
            log_producer_disconnect(node.log, error, was_ready=opened, unanswered=0)
            waiting, self._waiting = self._waiting, deque()
            for request in waiting:
                self._fail_request(request, error)
            orphans = list(node.inflight.values())
            node.inflight.clear()
            for request in orphans:
                self._fail_request(request, error)
            return
        lost = at_address(node.address, error or ConnectionLost("nsqd closed the connection"))
        node.last_exc = lost
        node.last_error = str(lost)
        if opened:
            # A connection that worked (nsqd closed it after refusing a publish, or it broke):
            # reconnect at once. Backoff is for attempts that fail to open.
            node.failures = 0
            node.retry_at = now
            if not self._loop.in_loop_thread():
                self._loop.wake()  # a caller saw the close; the IO thread may be asleep
        else:
            node.failures += 1
            node.retry_at = now + reconnect_delay(
                node.failures,
                self._config.reconnect_delay,
                self._config.max_reconnect_delay,
                self._config.reconnect_jitter,
                self._rng,
            )
        log_producer_disconnect(node.log, lost, was_ready=opened, unanswered=len(node.inflight))
        orphans = list(node.inflight.values())
        node.inflight.clear()
        node.out_pending.clear()
        held, node.held = node.held, deque()
        for request in (*orphans, *held):
            request.bound = None
        node.suspects = 0
        not_read = isinstance(error, ServerError)
        # Lost with others unanswered and no answer saying why (a reset, say, after nsqd
        # refused one of them: its answers may be gone with it): any of them may be at fault,
        # so each goes again alone. Lost alone: its own fault, or the node's.
        suspect = len(orphans) > 1 and not not_read
        for request in orphans:
            request.node = None
            request.suspect = suspect
            self._retried += 1
            if not_read:
                # nsqd closed the connection after refusing a publish ahead of this one and
                # never read this one: resending it is not a retry it should pay for.
                request.attempts -= 1
                if request.tried is not None:
                    request.tried.discard(node.address)
            self._dispatch(request)
        for request in held:  # never sent: waiting for their turn on this connection
            self._dispatch(request)
        self._fail_if_unreachable()

    def _fail_if_unreachable(self) -> None:
        """Publishes wait for a connection while no nsqd is up or connecting: every attempt
        made for them failed, so they fail now (within connect_timeout, not their own
        timeout), with each nsqd's cause."""
        if not self._waiting or self._closing:
            return
        if any(node.ready or node.link is not None for node in self._nodes):
            return
        refused = [node.config_error for node in self._nodes if node.config_error is not None]
        # Every nsqd refused the configuration: that error, as a single nsqd raises it.
        error = refused[0] if len(refused) == len(self._nodes) else self._unreachable()
        waiting, self._waiting = self._waiting, deque()
        for request in waiting:
            self._fail_request(request, error)

    def _unreachable(self, timed_out: float | None = None) -> NoNSQDAvailable:
        """Why no nsqd takes a publish now: one cause per nsqd (its last error; with
        ``timed_out``, a node still connecting says the publish's timeout came first)."""
        causes: dict[str, BaseException] = {}
        for node in self._nodes:
            error = node.last_exc
            if error is None or (node.link is not None and timed_out is not None):
                error = ConnectionLost(
                    f"{node.address}: not connected when the publish timed out after "
                    f"{seconds(timed_out or 0.0)}"
                    if timed_out is not None
                    else f"{node.address}: not connected"
                )
            if node.config_error is not None:
                error = node.config_error
            causes.setdefault(node.address, error)
        return NoNSQDAvailable(list(causes.values()))

    def _drain_waiting(self) -> None:
        waiting = self._waiting
        self._waiting = deque()
        for request in waiting:
            self._dispatch(request)

    def _io_write_pending(self) -> None:
        with self._io_lock:
            for node in self._nodes:
                wire = node.wire
                if (
                    node.conn is not None
                    and node.link is not None
                    and (wire is None or not wire.sending)
                ):
                    if node.out_pending:
                        self._loop.write(node.link, bytes(node.out_pending))
                        node.out_pending.clear()
                        if node.conn is None or node.link is None:
                            continue  # the write failed and tore the connection down
                    data = node.conn.data_to_send()
                    if data:
                        self._loop.write(node.link, data)

    def _io_next_deadline(self) -> float | None:
        with self._io_lock:
            return self._next_deadline()

    def _next_deadline(self) -> float | None:
        deadlines: list[float] = []
        for node in self._nodes:
            if node.conn is not None:
                deadline = node.conn.next_deadline()
                if deadline is not None:
                    deadlines.append(deadline)
                if node.ready_by is not None:
                    deadlines.append(node.ready_by)
            elif not self._closing and node.config_error is None:
                deadlines.append(node.retry_at)
        if self._waiting:
            deadlines.append(min(r.deadline for r in self._waiting))
        if self._expiry_check is not None:
            deadlines.append(self._expiry_check)
        if self._direct_check is not None:
            deadlines.append(self._direct_check)
        return min(deadlines) if deadlines else None

    def _io_timer(self, now: float) -> None:
        with self._io_lock:
            self._handle_timer(now)

    def _handle_timer(self, now: float) -> None:
        for node in self._nodes:
            if node.conn is not None:
                if node.ready_by is not None and now >= node.ready_by:
                    self._on_closed(
                        node, handshake_timed_out(node.address, self._config.connect_timeout), now
                    )
                    continue
                for event in node.conn.handle_timer(now):
                    if isinstance(event, ConnectionClosed):
                        self._on_closed(node, event.error, now)
            elif now >= node.retry_at and not self._closing:
                self._connect(node)
        if self._waiting:
            keep: deque[Request] = deque()
            for request in self._waiting:
                if now >= request.deadline:
                    timeout = request.deadline - request.start
                    self._fail_request(request, self._unreachable(timed_out=timeout))
                elif not request._done:
                    keep.append(request)
            self._waiting = keep
        if self._expiry_check is not None and now >= self._expiry_check:
            self._expire_inflight(now)
        if self._direct_check is not None and now >= self._direct_check:
            self._check_direct(now)

    def _expire_inflight(self, now: float) -> None:
        """Fail publishes unanswered past their deadline. They stay known to the core, which
        matches nsqd's late answer to them (and it is dropped): one periodic scan, not a timer
        per publish."""
        busy = False
        for node in self._nodes:
            if node.held:
                for request in [r for r in node.held if now >= r.deadline or r._done]:
                    node.held.remove(request)
                    self._fail_request(
                        request,
                        no_answer(
                            request.kind,
                            request.topic,
                            node.address,
                            request.deadline - request.start,
                        ),
                    )
                busy = busy or bool(node.held)
            if not node.inflight:
                continue
            expired = [rid for rid, r in node.inflight.items() if now >= r.deadline]
            for request_id in expired:
                request = node.inflight.pop(request_id)
                self._fail_request(
                    request,
                    no_answer(
                        request.kind,
                        request.topic,
                        node.address,
                        request.deadline - request.start,
                    ),
                )
            busy = busy or bool(node.inflight)
        self._expiry_check = now + self._expiry_tick if busy else None
