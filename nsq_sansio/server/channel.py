"""A channel of a topic: its queue, its in-flight and deferred messages, its subscribed clients
(nsqd's ``channel.go`` with ``in_flight_pqueue.go`` and the deferred ``pqueue.go``).

The queue keeps ``mem_queue_size`` messages in memory and the rest in a
:class:`~nsq_sansio.server.backend.Backend`, in FIFO order across both. :meth:`Channel.pump`
hands messages to ready clients in turn as their RDY allows and pauses a client whose unsent
output reached its high-water mark. A delivered message is in flight until its client FINs it,
REQs it (back to the queue, or deferred for a while) or times out; the in-flight and deferred
messages are min-heaps by deadline on which :meth:`Channel.process_timers` works a bounded step
at a time. What a channel needs of a client is spelled out in :class:`Subscriber`, so this
module does not import the client's.
"""

from __future__ import annotations

from collections import deque
from heapq import heapify, heappop, heappush
from typing import Generic, Protocol, TypeVar

from ..names import is_ephemeral
from .backend import Backend, BackendError, decode_record
from .context import INF, NodeContext
from .message import MAX_ATTEMPTS, Message, from_record, to_record
from .quantile import LatencyWindow
from .states import ClientState
from .wire import FRAME_MESSAGE, MESSAGE_FRAME_HEADER

__all__ = ["Channel", "Subscriber"]

# While a client is held back, its timer comes due this often (doubling while nothing is taken,
# up to the cap), so a transport that looks at connections_with_output only after its other
# calls still comes back for the output data_to_send queued when it resumed deliveries.
RESUME_POLL = 0.001
RESUME_POLL_MAX = 0.25
# Requeue of a message whose id is already in flight on the channel (only possible when a
# restored backend holds an id handed out again): it waits this long instead of spinning.
_DUPLICATE_ID_RETRY = 1.0
# At most this many timed-out or deferred messages of one channel go back to its queue per
# handle_timer call; the rest are due at once and handled by the next call.
TIMER_STEP = 1024
# Bound once: a method called on an imported name compiles to a slower attribute load (3.11).
_pack_message_header = MESSAGE_FRAME_HEADER.pack


class Subscriber(Protocol):
    """What a channel reads and writes of a subscribed client (nsqd's ``Consumer``)."""

    id: int
    state: ClientState
    ready_count: int  # the client's RDY
    in_flight: int  # messages delivered to it and not yet answered
    queued: bool  # in the channel's ready queue
    out: list[bytes]  # frames waiting for data_to_send
    out_len: int
    high_water: int  # deliveries pause while out_len is at least this
    blocked: bool  # paused at high_water with RDY left: data_to_send resumes it
    took: bool
    poll_delay: float
    alarm_at: float
    sample_rate: int
    msg_timeout: float
    message_count: int
    finish_count: int
    requeue_count: int


S = TypeVar("S", bound=Subscriber)


class Channel(Generic[S]):
    """A channel: its queue (memory then backend), in-flight and deferred messages, clients."""

    __slots__ = (
        "alarm_at",
        "backend",
        "clients",
        "context",
        "deferred_heap",
        "deleted",
        "ephemeral",
        "in_flight",
        "in_flight_heap",
        "latency",
        "mem",
        "mem_limit",
        "message_count",
        "name",
        "paused",
        "ready",
        "requeue_count",
        "spilled",
        "timeout_count",
        "topic_name",
    )

    def __init__(self, topic_name: str, name: str, backend: Backend, context: NodeContext) -> None:
        self.topic_name = topic_name
        self.name = name
        self.context = context
        self.ephemeral = is_ephemeral(name)
        self.paused = False
        self.deleted = False
        self.mem: deque[Message] = deque()
        self.mem_limit = context.mem_limit
        self.backend = backend
        # False only when the backend is known to be empty: spares a call per message.
        self.spilled = backend.depth > 0
        self.in_flight: dict[bytes, Message] = {}
        self.in_flight_heap: list[tuple[float, int, Message]] = []
        self.deferred_heap: list[tuple[float, int, Message]] = []
        self.clients: dict[int, S] = {}
        self.ready: deque[S] = deque()
        self.message_count = 0
        self.requeue_count = 0
        self.timeout_count = 0
        self.alarm_at = INF
        # Publish-to-FIN latencies, when nsqd's e2e processing latency percentiles are on.
        self.latency: LatencyWindow | None = None

    def depth(self) -> int:
        """Messages waiting in the queue (memory and backend), not in flight or deferred."""
        return len(self.mem) + self.backend.depth

    # ------------------------------------------------------------------ the queue

    def put(self, msg: Message) -> None:
        """Queue a message (memory while it has room and nothing spilled, else the backend)."""
        if len(self.mem) < self.mem_limit and not self.spilled:
            self.mem.append(msg)
            return
        try:
            self.backend.put(to_record(msg))
            self.spilled = True
        except BackendError as exc:
            # nsqd logs and marks itself unhealthy; keep the message in memory rather than lose it.
            self.context.backend_failed(exc)
            self.mem.append(msg)

    def put_record(self, record: bytes) -> None:
        """Queue a message already encoded as a backend record, behind everything queued (it
        goes to the backend; kept decoded in memory only when the backend refuses it)."""
        try:
            self.backend.put(record)
            self.spilled = True
        except BackendError as exc:
            self.context.backend_failed(exc)
            decoded = decode_record(record)
            if decoded is not None:
                self.mem.append(from_record(decoded))

    def next_message(self) -> Message | None:
        """Take the oldest queued message, or ``None``."""
        mem = self.mem
        backend = self.backend
        if mem:
            msg = mem.popleft()
            if not self.spilled:
                return msg
            # Keep FIFO order: what overflowed to the backend moves up as memory frees.
            while backend.depth and len(mem) < self.mem_limit:
                record = backend.get()
                if record is None:
                    break
                decoded = decode_record(record)
                if decoded is not None:
                    mem.append(from_record(decoded))
                    break
            self.spilled = backend.depth > 0
            return msg
        found = None
        while self.spilled:
            record = backend.get()
            self.spilled = backend.depth > 0
            if record is None:
                break
            decoded = decode_record(record)
            if decoded is not None:
                found = from_record(decoded)
                break
        return found

    def empty(self) -> None:
        """``/channel/empty``: drop queued, in-flight and deferred messages."""
        self.mem.clear()
        self.backend.empty()
        self.spilled = self.backend.depth > 0
        for msg in self.in_flight.values():
            msg.timer = -1
        self.in_flight.clear()
        self.in_flight_heap.clear()
        self.deferred_heap.clear()
        for conn in self.clients.values():
            conn.in_flight = 0
            self.enqueue_ready(conn)

    def discard(self) -> None:
        """The channel is being deleted: drop every client and message, delete the backend."""
        self.clients.clear()
        self.ready.clear()
        self.mem.clear()
        for msg in self.in_flight.values():
            msg.timer = -1
        self.in_flight.clear()
        self.in_flight_heap.clear()
        self.deferred_heap.clear()
        self.alarm_at = INF
        self.backend.delete()

    def persist(self) -> None:
        """Shutdown: queued, in-flight and deferred messages go to the backend (unless
        ephemeral), in that order; the backend is closed."""
        if not self.ephemeral:
            pending = list(self.mem)
            pending.extend(self.in_flight.values())
            pending.extend(entry[2] for entry in sorted(self.deferred_heap))
            for msg in pending:
                self.context.backend_put(self.backend, msg)
        self.mem.clear()
        self.in_flight.clear()
        self.in_flight_heap.clear()
        self.deferred_heap.clear()
        self.backend.close()

    # ------------------------------------------------------------------ in flight and deferred

    def defer(self, msg: Message, deadline: float) -> None:
        """Hold a message back until ``deadline`` (DPUB, REQ with a timeout)."""
        context = self.context
        context.seq += 1
        heappush(self.deferred_heap, (deadline, context.seq, msg))
        if deadline < self.alarm_at:
            context.arm(self, deadline)

    def start_in_flight_timer(self, msg: Message, deadline: float) -> None:
        """(Re)start an in-flight message's timeout; its older heap entry goes stale."""
        context = self.context
        context.seq += 1
        seq = context.seq
        msg.timer = seq
        heappush(self.in_flight_heap, (deadline, seq, msg))
        if deadline < self.alarm_at:
            context.arm(self, deadline)

    def _forget_in_flight(self, msg: Message) -> None:
        in_flight = self.in_flight
        del in_flight[msg.id]
        msg.timer = -1
        heap = self.in_flight_heap
        if len(heap) > 2 * len(in_flight) + 1024:
            heap[:] = [entry for entry in heap if entry[2].timer == entry[1]]
            heapify(heap)

    def owned_in_flight(self, conn: S, message_id: bytes) -> Message | str:
        """The message in flight to ``conn`` with this id, or nsqd's reason why not."""
        msg = self.in_flight.get(message_id)
        if msg is None:
            return "ID not in flight"
        if msg.owner != conn.id:
            return "client does not own message"
        return msg

    def finish(self, conn: S, msg: Message) -> bool:
        """A FIN that matched: the message is done. True when the client has room for more
        (it is back in the ready queue; the caller pumps once its input is processed)."""
        # _forget_in_flight inlined: this runs once per message.
        in_flight = self.in_flight
        del in_flight[msg.id]
        msg.timer = -1
        latency = self.latency
        if latency is not None:
            context = self.context
            now = context.now
            latency.insert(context.timestamp(now) - msg.timestamp, now)
        heap = self.in_flight_heap
        if len(heap) > 2 * len(in_flight) + 1024:
            heap[:] = [entry for entry in heap if entry[2].timer == entry[1]]
            heapify(heap)
        conn.finish_count += 1
        conn.in_flight -= 1
        if conn.in_flight < conn.ready_count:
            if not conn.queued and conn.state is ClientState.SUBSCRIBED:  # enqueue_ready
                conn.queued = True
                self.ready.append(conn)
            return True
        return False

    def requeue(self, conn: S, msg: Message, timeout: float, now: float) -> None:
        """A REQ that matched: back to the queue now, or deferred for ``timeout`` seconds."""
        self._forget_in_flight(msg)
        conn.requeue_count += 1
        conn.in_flight -= 1
        self.requeue_count += 1  # nsqd counts a REQ when it is made, delayed or not
        if timeout <= 0:
            self.put(msg)
        else:
            self.defer(msg, now + timeout)
        if conn.in_flight < conn.ready_count:
            self.enqueue_ready(conn)
        self.pump(now)

    def touch(self, conn: S, msg: Message, max_msg_timeout: float, now: float) -> None:
        """A TOUCH that matched: the timeout starts over, up to ``max_msg_timeout`` in all."""
        deadline = now + conn.msg_timeout
        if deadline - msg.delivered_at >= max_msg_timeout:
            deadline = msg.delivered_at + max_msg_timeout
        self.start_in_flight_timer(msg, deadline)

    def requeue_all_of(self, conn: S, now: float) -> None:
        """A vanished client's in-flight messages back at once (``requeue_in_flight_on_close``)."""
        mine = [msg for msg in self.in_flight.values() if msg.owner == conn.id]
        for msg in mine:
            del self.in_flight[msg.id]
            msg.timer = -1
            self.put(msg)
        conn.in_flight = 0
        self.pump(now)

    def process_timers(self, now: float) -> None:
        """Timed-out in-flight and due deferred messages go back to the queue (a bounded step:
        the rest is due at once), then deliver what that allows."""
        if self.deleted:
            return
        heap = self.in_flight_heap
        in_flight = self.in_flight
        clients = self.clients
        budget = TIMER_STEP
        while heap and heap[0][0] <= now and budget:
            _, seq, msg = heappop(heap)
            if msg.timer != seq:
                continue
            msg.timer = -1
            budget -= 1
            del in_flight[msg.id]
            self.timeout_count += 1
            owner = clients.get(msg.owner)
            if owner is not None:
                owner.in_flight -= 1
                if owner.in_flight < owner.ready_count:
                    self.enqueue_ready(owner)
            self.put(msg)
        deferred = self.deferred_heap
        while deferred and deferred[0][0] <= now and budget:
            self.put(heappop(deferred)[2])
            budget -= 1
        while heap and heap[0][2].timer != heap[0][1]:
            heappop(heap)
        next_at = min(heap[0][0] if heap else INF, deferred[0][0] if deferred else INF)
        if next_at < INF:
            # More due than one step takes: the rest at once, in the next handle_timer call.
            self.context.arm(self, max(next_at, now))
        self.pump(now)

    # ------------------------------------------------------------------ delivery

    def enqueue_ready(self, conn: S) -> None:
        """A subscribed client may take more: into the ready queue (once)."""
        if not conn.queued and conn.state is ClientState.SUBSCRIBED:
            conn.queued = True
            self.ready.append(conn)

    def pump(self, now: float) -> None:
        """Deliver queued messages to ready clients, one each in turn, as RDY allows."""
        if self.paused or self.deleted or not (self.mem or self.spilled):
            return
        ready = self.ready
        subscribed = ClientState.SUBSCRIBED
        self.context.now = now
        while ready:
            conn = ready[0]
            if conn.state is not subscribed or conn.in_flight >= conn.ready_count:
                ready.popleft()
                conn.queued = False
                continue
            if conn.out_len >= conn.high_water:
                # Output back-pressure: the client has not taken what it was sent. It leaves
                # the ready queue; data_to_send puts it back (nsqd's blocked messagePump).
                ready.popleft()
                conn.queued = False
                self._hold_back(conn, now)
                continue
            msg = self.next_message()
            if msg is None:
                return
            ready.popleft()
            self._deliver(conn, msg, now)
            if conn.in_flight >= conn.ready_count:
                conn.queued = False
            elif conn.out_len < conn.high_water:
                ready.append(conn)
            else:
                conn.queued = False
                self._hold_back(conn, now)

    def _hold_back(self, conn: S, now: float) -> None:
        """Pause deliveries to a client until it takes its output (polled, see RESUME_POLL)."""
        conn.blocked = True
        if not conn.poll_delay:
            conn.took = False
            conn.poll_delay = RESUME_POLL
            self.context.arm(conn, now + RESUME_POLL)

    def _deliver(self, conn: S, msg: Message, now: float) -> None:
        context = self.context
        sample_rate = conn.sample_rate
        if sample_rate and context.rng.randrange(100) > sample_rate:
            return  # nsqd's sampling: the message is consumed without being sent
        message_id = msg.id
        if message_id in self.in_flight:
            self.defer(msg, now + _DUPLICATE_ID_RETRY)
            return
        attempts = msg.attempts + 1
        if attempts > MAX_ATTEMPTS:
            attempts = MAX_ATTEMPTS
        msg.attempts = attempts
        msg.owner = conn.id
        msg.delivered_at = now
        self.in_flight[message_id] = msg
        deadline = now + conn.msg_timeout
        context.seq = seq = context.seq + 1
        msg.timer = seq
        heappush(self.in_flight_heap, (deadline, seq, msg))
        if deadline < self.alarm_at:
            context.arm(self, deadline)
        conn.in_flight += 1
        conn.message_count += 1
        body = msg.body
        out = conn.out
        out.append(_pack_message_header(30 + len(body), FRAME_MESSAGE, msg.timestamp, attempts))
        out.append(message_id)
        out.append(body)
        conn.out_len += 34 + len(body)
        context.dirty[conn.id] = None
