"""What the blocking producer keeps track of: :class:`Request` (one publish: what to send,
where it is, the future its caller holds), :class:`Node` (one connection to one nsqd, its
unanswered publishes, its failures), :class:`Wire` (callers' direct access to a plain TCP
socket) and :func:`connection_stats`, a node's snapshot. What a request needs of its producer
is spelled out by :class:`RequestOwner`, so this module does not import the producer.
"""

from __future__ import annotations

import logging
import select
import socket
import threading
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

from nsq_sansio.connection import ClientConnection
from nsq_sansio.errors import (
    IncompatibleNSQD,
)
from transports._common import (
    ConnectionLogger,
    ConnectionStats,
)

from ._loop import LoopSocket
from .publish_future import PublishFuture

__all__ = ["Node", "Request", "RequestOwner", "Wire", "connection_stats"]

_log = logging.getLogger("nsq_sansio.sync.producer")


class RequestOwner(Protocol):
    """What a :class:`Request` uses of the producer it belongs to."""

    _io_lock: threading.RLock
    _wakes: list[Any] | None

    def _await(self, request: Request, timeout: float | None, parked: bool = False) -> None: ...

    def _rescue_reads(self) -> None: ...


class Request(PublishFuture):
    """One publish: what to send, where it is, and the future its caller gets.

    Every field is read and written under the producer's ``_io_lock``. A thread waiting for it
    parks on ``_waiter`` (a lock held while not ``_signaled``), released when the request is
    done or when the thread is handed the connection's read role (``Wire.leader``).
    """

    __slots__ = (
        "_signaled",
        "alone",
        "attempts",
        "bound",
        "deadline",
        "kind",
        "node",
        "payload",
        "producer",
        "promoted",
        "start",
        "suspect",
        "topic",
        "tried",
        "waiting",
    )

    def __init__(
        self,
        producer: RequestOwner,
        kind: str,
        topic: str,
        payload: Any,
        start: float,
        deadline: float,
    ) -> None:
        self._done = False
        self._error: BaseException | None = None
        self._waiter: Any = None
        self._callbacks: list[Callable[[PublishFuture], object]] | None = None
        self._signaled = False
        self.producer = producer
        self.kind = kind
        self.topic = topic
        self.payload = payload
        self.start = start
        self.deadline = deadline
        self.tried: set[str] | None = None  # nsqd addresses it was sent to
        self.attempts = 0
        #: The node whose connection it is in flight on (None: not sent, or done).
        self.node: Node | None = None
        #: Threads parked on ``_waiter`` (candidates for the read role).
        self.waiting = 0
        #: The node whose read role was handed to this request's thread, until it takes it.
        self.promoted: Node | None = None
        #: Never coalesced into an MPUB (set once a coalesced MPUB with it was refused).
        self.alone = False
        #: Lost with other publishes unanswered on a connection that broke (a reset): its
        #: next send goes alone on its connection (see ``Node.suspects``).
        self.suspect = False
        #: The node it counts as a suspect of (held there, or in flight there alone).
        self.bound: Node | None = None

    def _wait(self, timeout: float | None) -> None:
        if not self._done:
            self.producer._await(self, timeout)

    def add_done_callback(self, fn: Callable[[PublishFuture], object]) -> None:
        """Call ``fn(future)`` when done: at once if it is, else on the thread that completes
        it (the one that read nsqd's answer, or the IO thread)."""
        producer = self.producer
        with producer._io_lock:
            if not self._done:
                if self._callbacks is None:
                    self._callbacks = []
                self._callbacks.append(fn)
                producer._rescue_reads()  # nobody may be waiting to read its answer
                return
        fn(self)

    def _set(self, error: BaseException | None) -> None:
        """Under the producer's lock: done; wake the waiters; run the callbacks."""
        self._error = error
        self._done = True
        waiter = self._waiter
        if waiter is not None and not self._signaled:
            self._signaled = True
            wakes = self.producer._wakes
            if wakes is None:
                waiter.release()
            else:
                wakes.append(waiter)  # released once the lock is given up
        callbacks = self._callbacks
        if callbacks:
            self._callbacks = None
            for fn in callbacks:
                try:
                    fn(self)
                except Exception:
                    _log.exception("publish future callback failed")


class Wire:
    """Callers' direct access to one plain TCP connection: a duplicate of its socket (so the
    IO loop closing its own descriptor never pulls this one from under a reader) and who uses
    it. Retired with its connection; the descriptor is closed by its last user."""

    __slots__ = (
        "broken",
        "closed",
        "direct",
        "lead_end",
        "leader",
        "poll",
        "retired",
        "sending",
        "sock",
        "users",
        "want_direct",
    )

    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        poller = select.poll()
        poller.register(sock.fileno(), select.POLLIN)
        self.poll = poller.poll
        #: Callers read the socket (the IO loop's reads of it are paused).
        self.direct = False
        #: A caller waiting for an answer asked for ``direct`` (the IO thread switches).
        self.want_direct = False
        #: The request whose thread holds the read role (``direct`` only).
        self.leader: Request | None = None
        self.lead_end = 0.0
        #: A caller is writing to the socket (outside the lock): the only writer meanwhile.
        self.sending = False
        #: Threads using ``sock`` outside the lock right now (the leader, the writer).
        self.users = 0
        self.retired = False
        self.closed = False
        #: The loop failed writing to the connection while a caller read it.
        self.broken: BaseException | None = None


@dataclass
class Node:
    address: str
    host: str
    port: int
    link: LoopSocket | None = None
    conn: ClientConnection | None = None
    ready: bool = False
    failures: int = 0
    retry_at: float = 0.0
    #: Not READY (IDENTIFY/TLS/AUTH answered) by then: give up on this attempt.
    ready_by: float | None = None
    #: Inside IOLoop.connect(), which may report a failure before it returns.
    connecting: bool = False
    last_error: str | None = None
    #: Why the last attempt or connection failed (``last_error`` is its text).
    last_exc: BaseException | None = None
    #: nsqd refused IDENTIFY on the last attempt: no reconnect until a publish asks for one.
    config_error: IncompatibleNSQD | None = None
    #: When that attempt failed (a publish within reconnect_delay of it fails with it at once).
    refused_at: float = float("-inf")
    published: int = 0
    failed: int = 0
    #: Connection attempts made (the first ones are made once, by whoever comes first).
    attempts: int = 0
    #: Connections that reached READY (``reconnects`` is the ones after the first, as on anyio).
    connects: int = 0
    #: The last coalesced MPUB refusal logged (one warning per refused group, not per PUB).
    last_refused: BaseException | None = None
    logger: logging.Logger = _log

    def __post_init__(self) -> None:
        self.inflight: dict[int, Request] = {}
        #: Bytes a caller's direct send did not get out; the IO thread writes them first.
        self.out_pending = bytearray()
        #: Plain TCP, ready: callers' direct access to the socket (None: the IO thread's only).
        self.wire: Wire | None = None
        #: Suspect publishes (lost in a reset with others) bound for this node: while there
        #: are any, it sends one publish at a time, each once nothing else is in flight.
        self.suspects = 0
        #: Publishes waiting for their turn to be sent alone (not sent: ``node`` is None).
        self.held: deque[Request] = deque()
        self.log = ConnectionLogger(self.logger, self.address)


def connection_stats(node: Node, closed: bool = False) -> ConnectionStats:
    """A node's snapshot (any thread: each field is read once); every connection of a
    ``closed`` producer is "closed" (its socket may still be flushing out)."""
    conn, link = node.conn, node.link  # read once: the IO thread may replace them
    if node.ready:
        state = "ready"
    elif closed or conn is None or link is None:
        state = "closed"
    elif link._connecting:
        state = "connecting"
    else:
        state = "handshaking"
    return ConnectionStats(
        address=node.address,
        state=state,
        connected=node.ready,
        in_flight=len(node.inflight),
        reconnects=max(node.connects - 1, 0),
        bytes_received=link.bytes_in if link is not None else 0,
        bytes_sent=link.bytes_out if link is not None else 0,
        last_error=node.last_error,
    )
