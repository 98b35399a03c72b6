"""A simulated consumer: the core's :class:`~nsq_sansio.consumer.ConsumerCoordinator` driven as a
transport would drive it, with a simulated user :class:`~nsq_sansio.testing.handler.Handler`
(jobs that take time, fail, hang or keep the message alive), push or pull, and drains.
"""

from __future__ import annotations

import random
from collections import deque
from collections.abc import Iterable
from dataclasses import dataclass, field

from ...config import Config
from ...consumer import (
    CloseConnection,
    CloseHTTPRequest,
    Connect,
    ConsumerCoordinator,
    ConsumerState,
    Deliver,
    DrainComplete,
    FetchEnd,
    FetchResult,
    GiveUp,
    SendHTTPRequest,
    StartTLS,
    TakenBack,
)
from ...errors import NSQError
from ..handler import Handler
from ..network import ConnState, SimConn
from ..violations import Invariant
from .base import SimNode, World

HANG = object()

__all__ = ["ConsumerNode", "ConsumerStats"]


@dataclass(slots=True)
class _Job:
    delivery: Deliver
    done_at: float
    cancelled: bool = False


@dataclass(slots=True)
class ConsumerStats:
    delivered: int = 0
    finished: int = 0
    requeued: int = 0
    given_up: int = 0
    taken_back: int = 0
    touches: int = 0
    lookup_polls: list[float] = field(default_factory=list)


class ConsumerNode(SimNode):
    """A consumer: the core's :class:`ConsumerCoordinator` with a simulated user handler."""

    def __init__(
        self,
        sim: World,
        name: str,
        topic: str,
        channel: str,
        config: Config,
        handler: Handler,
        *,
        nsqd: Iterable[str] = (),
        lookupd: Iterable[str] = (),
        seed: int = 0,
        pull: bool = False,
        fetch_batch: int = 10,
    ) -> None:
        super().__init__(sim, name)
        self.topic = topic
        self.channel = channel
        self.config = config
        self.handler = handler
        self.nsqd_addresses = list(nsqd)
        self.lookupd_addresses = list(lookupd)
        self.rng = random.Random(seed)
        self.pull = pull
        self.fetch_batch = fetch_batch
        self.fetching = False
        self.coord = ConsumerCoordinator(
            topic,
            channel,
            config,
            rng=self.rng,
            nsqd=self.nsqd_addresses,
            lookupd=self.lookupd_addresses,
            pull=pull,
        )
        self.started = False
        self.drained_at: float | None = None
        self.drain_started_at: float | None = None
        self.stats = ConsumerStats()
        self.conn_of: dict[int, SimConn] = {}  # coordinator conn id -> SimConn
        self.coord_id: dict[int, int] = {}  # SimConn.id -> coordinator conn id
        self.http_of: dict[int, SimConn] = {}  # request id -> SimConn
        self.http_req: dict[int, tuple[int, bytes]] = {}  # SimConn.id -> (request id, data)
        self.jobs: dict[bytes, _Job] = {}
        self.waiting: deque[Deliver] = deque()

    def start(self, now: float) -> None:
        """Start the consumer: its coordinator connects, and a pull consumer places its first
        fetches."""
        self.started = True
        self.coord.start(now)
        self._fetch_more(now)
        self._pump(now)

    def _fetch_more(self, now: float) -> None:
        """Pull mode: ask for the next batch once the last one is handled (a fetch loop)."""
        if (
            not self.pull
            or self.fetching
            or self.jobs
            or self.waiting
            or self.coord.state is not ConsumerState.RUNNING
        ):
            return
        self.fetching = True
        self.coord.fetch(self.fetch_batch, now, expires=2.0)

    def drain(self, now: float, timeout: float | None = None) -> None:
        """Start a graceful drain of this consumer (RDY 0 everywhere, finish what is held),
        recorded by the monitor so the drain invariant watches it."""
        self.drain_started_at = now
        self.sim.monitor.on_drain_started(self.name, now)
        self.coord.drain(now, timeout)
        self._pump(now)

    def kill(self, now: float) -> None:
        """The consumer process dies at once (no drain): nsqd sees its connections reset."""
        if not self.alive:
            return
        self.sim.monitor.on_consumer_killed(self.name, now)
        self.sim.net.crash_node(self)
        self.alive = False
        for job in self.jobs.values():
            job.cancelled = True
        self.jobs.clear()
        self.waiting.clear()

    # network
    def on_accept(self, conn: SimConn, now: float) -> None:  # pragma: no cover - never listens
        """A consumer never listens: a connection to it is closed at once."""
        self.sim.net.close(conn, self)

    def on_connected(self, conn: SimConn, now: float) -> None:
        """A connection opened: an nsqd connection starts its handshake, a lookupd one sends
        its HTTP request."""
        cid = self.coord_id.get(conn.id)
        if cid is not None:
            self.coord.connection_made(cid, now)
        else:
            request = self.http_req.get(conn.id)
            if request is not None:
                self.sim.net.send(conn, self, request[1])
        self._pump(now)

    def on_connect_failed(self, conn: SimConn, now: float) -> None:
        """A connection to an nsqd or an HTTP request to lookupd failed: the coordinator is
        told, as a transport would."""
        cid = self.coord_id.pop(conn.id, None)
        if cid is not None:
            self.conn_of.pop(cid, None)
            self.coord.connection_failed(cid, "connection refused or timed out", now)
        else:
            request = self.http_req.pop(conn.id, None)
            if request is not None:
                self.http_of.pop(request[0], None)
                self.coord.http_failed(request[0], "connection refused or timed out", now)
        self._pump(now)

    def on_data(self, conn: SimConn, data: bytes, now: float) -> None:
        """Bytes from an nsqd go to the coordinator's receive_data, from lookupd to its HTTP
        response parser."""
        cid = self.coord_id.get(conn.id)
        if cid is not None:
            self.coord.receive_data(cid, data, now)
        else:
            request = self.http_req.get(conn.id)
            if request is not None:
                self.coord.http_data(request[0], data, now)
        self._pump(now)

    def on_eof(self, conn: SimConn, now: float) -> None:
        """The peer closed: the coordinator sees the end of the stream, as a transport
        reports it."""
        cid = self.coord_id.pop(conn.id, None)
        if cid is not None:
            self.conn_of.pop(cid, None)
            self.sim.monitor.on_client_conn_ended(conn, by_client=False)
            self.coord.receive_data(cid, b"", now)
        else:
            request = self.http_req.get(conn.id)
            if request is not None:
                self.coord.http_data(request[0], b"", now)
        self._pump(now)
        if conn.state is not ConnState.CLOSED:
            self.sim.net.close(conn, self)

    def next_deadline(self) -> float | None:
        """The coordinator's next deadline (its timers drive this node)."""
        return self.coord.next_deadline()

    def handle_timer(self, now: float) -> None:
        self.coord.handle_timer(now)
        self._pump(now)

    # the transport loop
    def _pump(self, now: float) -> None:
        net = self.sim.net
        coord = self.coord
        monitor = self.sim.monitor
        for _ in range(1000):
            actions = coord.take_actions()
            for action in actions:
                kind = type(action)
                if kind is Deliver:
                    self._deliver(action, now)  # type: ignore[arg-type]
                elif kind is Connect:
                    assert isinstance(action, Connect)
                    conn = net.connect(self, str(action.address))
                    self.conn_of[action.conn_id] = conn
                    self.coord_id[conn.id] = action.conn_id
                elif kind is CloseConnection:
                    assert isinstance(action, CloseConnection)
                    closing = self.conn_of.pop(action.conn_id, None)
                    if closing is not None:
                        self.coord_id.pop(closing.id, None)
                        net.send(closing, self, action.final_data)
                        monitor.on_client_conn_ended(closing, by_client=True)
                        net.close(closing, self)
                elif kind is SendHTTPRequest:
                    assert isinstance(action, SendHTTPRequest)
                    address = f"{action.lookupd.host}:{action.lookupd.port}"
                    conn = net.connect(self, address)
                    self.http_of[action.request_id] = conn
                    self.http_req[conn.id] = (action.request_id, action.data)
                    self.stats.lookup_polls.append(now)
                elif kind is CloseHTTPRequest:
                    assert isinstance(action, CloseHTTPRequest)
                    http = self.http_of.pop(action.request_id, None)
                    if http is not None:
                        self.http_req.pop(http.id, None)
                        net.close(http, self)
                elif kind is GiveUp:
                    assert isinstance(action, GiveUp)
                    self.stats.given_up += 1
                    monitor.on_give_up(
                        self.name, self.topic, self.channel, action.message.body, now
                    )
                elif kind is TakenBack:
                    self.stats.taken_back += 1
                elif kind is FetchResult:
                    assert isinstance(action, FetchResult)
                    self.fetching = False
                    for delivery in action.messages:
                        self._deliver(delivery, now)
                    if action.reason is not FetchEnd.DRAINING:
                        self._fetch_more(now)
                elif kind is DrainComplete:
                    self.drained_at = now
                    monitor.on_drain_complete(self.name, now)
                elif kind is StartTLS:  # pragma: no cover - no TLS in the sim
                    raise NSQError("the simulator does not run TLS")
            for cid, data in coord.pending_data():
                target = self.conn_of.get(cid)
                if target is not None:
                    net.send(target, self, data)
            if not actions:
                break
        monitor.on_consumer_step(self.name, self.coord.max_in_flight, now)

    # simulated user code
    def _deliver(self, delivery: Deliver, now: float) -> None:
        self.stats.delivered += 1
        if (
            self.coord.state is not ConsumerState.RUNNING
            and self.coord.state is not ConsumerState.DRAINING
        ):
            return
        limit = self.handler.concurrency
        if limit is not None and len(self.jobs) >= limit:
            self.waiting.append(delivery)
            return
        self._start_job(delivery, now)

    def _start_next(self, now: float) -> None:
        limit = self.handler.concurrency
        while self.waiting and (limit is None or len(self.jobs) < limit):
            delivery = self.waiting.popleft()
            if self.coord.deadline(delivery) is None:
                continue  # requeued by a drain, or its connection is gone: not ours any more
            self._start_job(delivery, now)

    def _start_job(self, delivery: Deliver, now: float) -> None:
        self.coord.mark_delivered(delivery)
        duration, hang = self.handler.decide(delivery, self.rng)
        if hang:
            return
        job = _Job(delivery, now + duration)
        self.sim.monitor.on_job(self.name, delivery.body, now, now + duration)
        old = self.jobs.get(delivery.id)
        if old is not None:
            old.cancelled = True
        self.jobs[delivery.id] = job
        self.sim.scheduler.call_at(now + duration, self._job_done, job)
        if self.handler.keepalive:
            self._schedule_touch(job, now)

    def _schedule_touch(self, job: _Job, now: float) -> None:
        deadline = self.coord.deadline(job.delivery)
        if deadline is None:
            return
        # touch at half the time left, like the transports' keepalive helper
        at = now + max((deadline - now) / 2, 0.001)
        if at < job.done_at:
            self.sim.scheduler.call_at(at, self._touch, job)

    def _touch(self, job: _Job) -> None:
        if job.cancelled or not self.alive:
            return
        now = self.sim.now
        limit = self.coord.max_deadline(job.delivery)
        current = self.coord.deadline(job.delivery)
        if limit is None or current is None or current >= limit:
            return
        try:
            self.coord.touch(job.delivery, now)
        except NSQError as exc:
            self.sim.monitor.violate(
                Invariant.CLIENT_API, now, f"{self.name}: touch({job.delivery.id!r}) raised {exc!r}"
            )
            return
        self.stats.touches += 1
        self._pump(now)
        self.sim.after(self)
        self._schedule_touch(job, now)

    def _job_done(self, job: _Job) -> None:
        if job.cancelled or not self.alive:
            return
        if self.jobs.get(job.delivery.id) is job:
            del self.jobs[job.delivery.id]
        now = self.sim.now
        handler = self.handler
        try:
            verdict = handler.outcome(job.delivery, self.rng)
            if verdict is None:
                pass  # stuck: never answers (nsqd times the message out)
            elif verdict:
                if self.coord.finish(job.delivery, now):
                    self.stats.finished += 1
                    self.sim.monitor.on_handled(self.name, job.delivery, now)
            elif self.coord.requeue(
                job.delivery, now, handler.requeue_delay, backoff=handler.backoff
            ):
                self.stats.requeued += 1
        except NSQError as exc:
            self.sim.monitor.violate(
                Invariant.CLIENT_API,
                now,
                f"{self.name}: answering message {job.delivery.id!r} (attempt "
                f"{job.delivery.attempts}) raised {exc!r}",
            )
        self._start_next(now)
        self._fetch_more(now)
        self._pump(now)
        self.sim.after(self)
