"""Invariants of a simulated cluster, checked after every step and at the end of a run.

Per step (from the wire, independently of the state machines' own bookkeeping):

* ``RDY_SUM``: the RDY a consumer last sent, summed over its live connections, never exceeds
  its ``max_in_flight`` (after every RDY written; ``rdy_per_write=False``: after every step).
* ``RDY_IN_FLIGHT``: nsqd never pushes a message on a connection that already holds as many
  un-answered, un-expired messages as the RDY it last received there (so a consumer never has
  more in flight than its RDY allowed).
* ``HELD``: the messages a consumer holds, summed over its connections, never exceed its
  ``max_in_flight`` (checked whenever nsqd sends it one: counted from nsqd's send until the
  consumer's FIN/REQ, so messages still on the wire count; messages nsqd already timed out do
  not). A lowered RDY does not take back what is already in flight, so this bounds what RDY
  is given, not only its sum. A message a partition held, or one nsqd sent only because a
  partition held back a lower RDY the client wrote, counts from its arrival instead (no client
  can know of it before), checked once the consumer has reacted to it: it must hand back what
  does not fit. Read with the current ``max_in_flight``: lowering it at run time is not
  modelled.
* ``BACKOFF_RDY``: while a consumer backs off it sends RDY 0 (waiting), or no more than its
  test lets in (testing: one message more than it held when the test began, two more per
  success since; never one that lets nsqd send more).
* ``ATTEMPTS``: every delivery of a message on a channel carries a higher attempts count than
  the one before (what ``max_attempts`` relies on).

At the end:

* ``AT_LEAST_ONCE``: every message a broker accepted (acknowledged PUB/MPUB, or an HTTP publish)
  was finished by some consumer of each channel, or given up after ``max_attempts``, unless the
  broker holding it crashed without it on (durable) disk.
* ``DRAIN``: a drained consumer answered (FIN or REQ) every message it received before closing,
  so nothing it had is left to time out; and every drain completes.
* ``DISCOVERY``: after partitions heal, each lookupd consumer is connected to exactly the live
  nsqd nodes.
* ``BROKER_EMPTY``: live brokers hold nothing for the channels (nothing stuck).

Any time: ``CLIENT_API``: answering a delivery (finish/requeue/touch) never raises; a stale one
returns False and reports ``TakenBack``, as the coordinator promises.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable
from typing import TYPE_CHECKING

from ..backoff import BackoffPhase
from .network import CLIENT_TO_SERVER, SimConn
from .nodes import ConsumerNode, NsqdNode, World
from .violations import Invariant, InvariantViolation, Violation
from .wire import (
    ClientCommand,
    CommandParser,
    FrameParser,
    ServerFrame,
    identify_answer,
)

if TYPE_CHECKING:
    from ..consumer import Deliver

__all__ = ["Invariant", "InvariantViolation", "Monitor", "Violation"]


class _Pipe:
    """What one client<->nsqd connection carried, as parsed from the wire."""

    __slots__ = (
        "blind",
        "client",
        "client_rdy",
        "conn",
        "delivered_commands",
        "frames",
        "held",
        "max_msg_timeout",
        "monitor",
        "msg_timeout",
        "nsqd",
        "opaque",
        "outstanding",
        "parser",
        "partitioned",
        "rdy_unread",
        "received",
        "server_rdy",
        "step_rdy",
        "step_time",
        "topic_channel",
    )

    def __init__(self, monitor: Monitor, conn: SimConn) -> None:
        self.monitor = monitor
        self.conn = conn
        self.client = conn.client.name
        self.nsqd = conn.server.name if conn.server is not None else "?"
        self.parser = CommandParser()  # what the client wrote
        self.delivered_commands = CommandParser()  # what reached nsqd (maybe in pieces)
        self.frames = FrameParser()
        self.opaque = False
        self.client_rdy = 0
        self.server_rdy = 0
        self.step_rdy = 0
        self.step_time = -1.0
        self.msg_timeout = 60.0
        self.max_msg_timeout = 900.0
        #: message id -> (server timeout deadline, first delivery time), the server's view
        self.outstanding: dict[bytes, tuple[float, float]] = {}
        #: ids the client received and has not answered (FIN/REQ) yet
        self.held: set[bytes] = set()
        #: The bytes being written now wait in the network (a partition holds them).
        self.partitioned = False
        #: RDY the client wrote and nsqd has not read yet: (count, held by a partition).
        self.rdy_unread: deque[tuple[int, bool]] = deque()
        #: Messages the network held that way: (end offset in nsqd's stream, id). They count
        #: as held once they arrive (``received`` bytes reach the offset), not from the send.
        self.blind: list[tuple[int, bytes]] = []
        self.received = 0
        self.topic_channel: tuple[str, str] | None = None

    def sent(self, direction: int, data: bytes, now: float) -> None:
        if self.opaque:
            return
        conn = self.conn
        server = conn.server
        self.partitioned = bool(conn.held) or (
            server is not None and not self.monitor.sim.net.reachable(self.client, server.name)
        )
        if direction == CLIENT_TO_SERVER:
            for command in self.parser.feed(data):
                self._client_command(command, now)
        else:
            self.frames.feed(data, lambda frame: self._server_frame(frame, now))

    def delivered(self, direction: int, data: bytes, now: float) -> None:
        if self.opaque:
            return
        if direction != CLIENT_TO_SERVER:
            self.received += len(data)
            if self.blind:
                self._blind_arrived(now)
            return
        # nsqd runs a chunk's commands one by one and may push messages between them (a REQ
        # frees a slot before a later RDY 0 is read): during this step the highest RDY counts.
        if self.step_time != now:
            self.step_time = now
            self.step_rdy = self.server_rdy
        for command in self.delivered_commands.feed(data):
            verb = command.verb
            if verb == b"RDY":
                if self.rdy_unread:
                    self.rdy_unread.popleft()
                self.server_rdy = int(command.args[0])
                if self.server_rdy > self.step_rdy:
                    self.step_rdy = self.server_rdy
            elif verb == b"FIN" or verb == b"REQ":
                self.outstanding.pop(command.args[0], None)
            elif verb == b"TOUCH":
                entry = self.outstanding.get(command.args[0])
                if entry is not None and entry[0] > now:
                    first = entry[1]
                    self.outstanding[command.args[0]] = (
                        min(now + self.msg_timeout, first + self.max_msg_timeout),
                        first,
                    )

    def closed(self, now: float) -> None:
        self.monitor.pipe_closed(self, now)

    def _answered(self, message_id: bytes) -> None:
        self.held.discard(message_id)
        if self.blind:  # answered as soon as its frame was read, before the rest arrived
            self.blind = [entry for entry in self.blind if entry[1] != message_id]

    def _under_stale_rdy(self, now: float) -> bool:
        """nsqd has not read an RDY a partition held back, and the messages in flight here
        already fill it."""
        if not any(held for _, held in self.rdy_unread):
            return False
        live = sum(1 for deadline, _ in self.outstanding.values() if deadline > now)
        return any(held and live >= count for count, held in self.rdy_unread)

    def _blind_arrived(self, now: float) -> None:
        arrived = [entry for entry in self.blind if entry[0] <= self.received]
        if not arrived:
            return
        del self.blind[: len(arrived)]
        for _, message_id in arrived:
            entry = self.outstanding.get(message_id)
            if entry is not None and entry[0] > now:
                self.held.add(message_id)
        # checked once the consumer has seen them (it may hand them back at once)
        self.monitor.check_after_step.add(self.client)

    def _client_command(self, command: ClientCommand, now: float) -> None:
        verb = command.verb
        monitor = self.monitor
        if verb == b"RDY":
            count = int(command.args[0])
            self.client_rdy = count
            self.rdy_unread.append((count, self.partitioned))
            monitor.rdy_sent(self, count, now)
        elif verb == b"FIN":
            self._answered(command.args[0])
            monitor.fin_sent(self, command.args[0], now)
        elif verb == b"REQ":
            self._answered(command.args[0])
        elif verb == b"SUB":
            self.topic_channel = (command.args[0].decode(), command.args[1].decode())
            monitor.subscribed(self)

    def _server_frame(self, frame: ServerFrame, now: float) -> None:
        if frame.message is not None:
            message_id, attempts, body = frame.message
            allowed = self.step_rdy if now == self.step_time else self.server_rdy
            live = len(self.outstanding)
            if live >= allowed:  # count precisely only when it might matter
                live = 0
                for deadline, _ in self.outstanding.values():
                    if deadline > now:
                        live += 1
            if live >= allowed:
                self.monitor.violate(
                    Invariant.RDY_IN_FLIGHT,
                    now,
                    f"{self.nsqd} pushed a message to {self.client} (conn {self.conn.id}) holding "
                    f"{live} un-expired messages with RDY {allowed}",
                )
            if self.partitioned or self._under_stale_rdy(now):
                # A partition holds it, or it goes out only because a partition held back
                # the lower RDY the client wrote: no client can know of it (nor know what
                # nsqd read) until it arrives, so it counts from then.
                self.blind.append((self.frames.consumed, message_id))
                self.outstanding[message_id] = (now + self.msg_timeout, now)
                self.monitor.message_sent(self, message_id, attempts, body, now, check=False)
                return
            self.outstanding[message_id] = (now + self.msg_timeout, now)
            self.held.add(message_id)
            self.monitor.message_sent(self, message_id, attempts, body, now)
            return
        if frame.frame_type == 0:
            answer = identify_answer(frame.data)
            if answer is not None:
                timeout = answer.get("msg_timeout")
                if isinstance(timeout, int) and timeout > 0:
                    self.msg_timeout = timeout / 1000
                max_timeout = answer.get("max_msg_timeout")
                if isinstance(max_timeout, int) and max_timeout > 0:
                    self.max_msg_timeout = max_timeout / 1000
                if answer.get("snappy") or answer.get("deflate") or answer.get("tls_v1"):
                    self.opaque = True


class Monitor:
    """Collects what happened in a run and checks the invariants."""

    def __init__(self, sim: World, *, rdy_per_write: bool = True) -> None:
        self.sim = sim
        #: Check the RDY sum after every RDY written, not only after every step: a consumer
        #: must write the decreases that fund an increase first (False: per step only).
        self.rdy_per_write = rdy_per_write
        self.violations: list[Violation] = []
        self._pipes: dict[int, _Pipe] = {}
        self._consumer_pipes: dict[str, dict[int, _Pipe]] = {}
        # ledger: (topic, channel, body) -> home nsqd ; outcome sets
        self.expected: dict[tuple[str, str, bytes], str] = {}
        self.accepted_at: dict[bytes, float] = {}
        self.finished: set[tuple[str, str, bytes]] = set()
        self.given_up: set[tuple[str, str, bytes]] = set()
        self.excused: set[tuple[str, str, bytes]] = set()
        self.handled: dict[tuple[str, str, bytes], int] = {}
        self.deliveries: dict[tuple[str, str, bytes], int] = {}
        self.first_handled_at: dict[tuple[str, str, bytes], float] = {}
        self._id_body: dict[tuple[str, bytes], bytes] = {}
        self._attempts: dict[tuple[str, str, bytes], int] = {}
        self.lookup_requests: list[tuple[float, str, str]] = []
        self.draining: set[str] = set()
        #: consumer -> when its drain completed (DrainComplete)
        self.drained: dict[str, float] = {}
        self.drain_leftovers: dict[str, int] = {}
        self.messages_sent = 0
        #: Consumers to check (``HELD``) at the end of their current step: messages nsqd sent
        #: blind (see ``_Pipe.blind``) arrived, and they may hand them back at once.
        self.check_after_step: set[str] = set()
        #: (body, consumer, start, planned end) of every job user code ran
        self.jobs: list[tuple[bytes, str, float, float]] = []

    # -- plumbing ---------------------------------------------------------------------------

    def observe(self, conn: SimConn) -> _Pipe | None:
        """Observer factory for the network: V2 connections from clients to nsqd."""

        server = conn.server
        if isinstance(server, NsqdNode) and conn.port == server.options.tcp_port:
            pipe = _Pipe(self, conn)
            self._pipes[conn.id] = pipe
            self._consumer_pipes.setdefault(conn.client.name, {})[conn.id] = pipe
            return pipe
        return None

    def violate(self, invariant: Invariant, now: float, detail: str) -> None:
        """Record a broken ``invariant`` at ``now`` (raised later by
        :meth:`Simulator.raise_if_violated`, so one run reports everything it found)."""
        self.violations.append(Violation(invariant, now, detail))

    # -- wire events ------------------------------------------------------------------------

    def rdy_sent(self, pipe: _Pipe, count: int, now: float) -> None:
        """A consumer wrote RDY ``count`` on ``pipe``: with ``rdy_per_write`` the sum of its
        written RDY must stay within its max_in_flight after every write."""
        if self.rdy_per_write:
            node = self.sim.nodes.get(pipe.client)
            pipes = self._consumer_pipes.get(pipe.client, {})
            total = sum(p.client_rdy for p in pipes.values())
            if isinstance(node, ConsumerNode) and total > node.coord.max_in_flight:
                detail = ", ".join(f"{p.nsqd}={p.client_rdy}" for p in pipes.values())
                self.violate(
                    Invariant.RDY_SUM,
                    now,
                    f"{pipe.client} RDY sum {total} > max_in_flight "
                    f"{node.coord.max_in_flight} after writing RDY {count} to "
                    f"{pipe.nsqd} ({detail})",
                )
        if count == 0:
            return
        node = self.sim.nodes.get(pipe.client)
        if not isinstance(node, ConsumerNode):
            return
        coord = node.coord
        if coord.backoff_phase is BackoffPhase.NORMAL:
            return
        allowed = min(coord.backoff_allowance, coord.max_in_flight)  # 0 while waiting
        if count > allowed:
            self.violate(
                Invariant.BACKOFF_RDY,
                now,
                f"{pipe.client} sent RDY {count} to {pipe.nsqd} while backing off "
                f"({coord.backoff_phase.name}, level {coord.backoff_level}, at most "
                f"{allowed})",
            )

    def subscribed(self, pipe: _Pipe) -> None:
        """A SUB went out on ``pipe``."""

    def message_sent(
        self,
        pipe: _Pipe,
        message_id: bytes,
        attempts: int,
        body: bytes,
        now: float,
        *,
        check: bool = True,
    ) -> None:
        """nsqd wrote a message on ``pipe``: checked against the RDY nsqd read and the
        consumer's max_in_flight (what it may hold), and remembered for the final check."""
        self.messages_sent += 1
        if check:
            self._check_held(pipe.client, now)
        self._id_body[(pipe.nsqd, message_id)] = body
        if pipe.topic_channel is not None:
            key = (pipe.topic_channel[0], pipe.topic_channel[1], body)
            self.deliveries[key] = self.deliveries.get(key, 0) + 1
            counted = (pipe.nsqd, pipe.topic_channel[1], message_id)
            before = self._attempts.get(counted, 0)
            # nsqd counts an attempt when it hands the message to a connection, even if the
            # bytes never leave (the connection died first): so "more", not "one more"
            if attempts <= before:
                self.violate(
                    Invariant.ATTEMPTS,
                    now,
                    f"{pipe.nsqd} delivered {message_id!r} ({body!r}) on "
                    f"{pipe.topic_channel[1]} with attempts {attempts}, after a "
                    f"delivery with attempts {before}",
                )
            self._attempts[counted] = attempts

    def _check_held(self, consumer: str, now: float) -> None:
        """``HELD``: what ``consumer`` holds (nsqd sent, not answered, not timed out)."""

        node = self.sim.nodes.get(consumer)
        pipes = self._consumer_pipes.get(consumer)
        if not isinstance(node, ConsumerNode) or not pipes:
            return
        limit = node.coord.max_in_flight
        if sum(len(p.held) for p in pipes.values()) <= limit:
            return  # the common case: no need to look at deadlines
        counts: dict[str, int] = {}
        for p in pipes.values():
            live = sum(
                1 for i in p.held if (entry := p.outstanding.get(i)) is not None and entry[0] > now
            )
            counts[p.nsqd] = counts.get(p.nsqd, 0) + live
        total = sum(counts.values())
        if total > limit:
            detail = ", ".join(f"{name}={n}" for name, n in counts.items())
            self.violate(
                Invariant.HELD,
                now,
                f"{consumer} holds {total} messages > max_in_flight {limit} ({detail})",
            )

    def fin_sent(self, pipe: _Pipe, message_id: bytes, now: float) -> None:
        """nsqd read a FIN for ``message_id`` on ``pipe``: that message counts as finished."""
        body = self._id_body.get((pipe.nsqd, message_id))
        if body is not None and pipe.topic_channel is not None:
            self.finished.add((pipe.topic_channel[0], pipe.topic_channel[1], body))

    def pipe_closed(self, pipe: _Pipe, now: float) -> None:
        """A connection between a consumer and an nsqd closed: its RDY and in-flight count
        no longer count."""
        self._consumer_pipes.get(pipe.client, {}).pop(pipe.conn.id, None)
        self._pipes.pop(pipe.conn.id, None)

    def on_client_conn_ended(self, conn: SimConn, *, by_client: bool) -> None:
        """The client closed its connection (``by_client``) or learnt it is gone: its RDY is
        released. A draining consumer that closes must have answered everything it got."""
        pipe = self._pipes.get(conn.id)
        if pipe is None:
            return
        self._consumer_pipes.get(pipe.client, {}).pop(conn.id, None)
        pipe.client_rdy = 0
        if by_client and pipe.client in self.draining and pipe.held and self._healthy(conn):
            now = self.sim.now
            self.drain_leftovers[pipe.client] = self.drain_leftovers.get(pipe.client, 0) + len(
                pipe.held
            )
            self.violate(
                Invariant.DRAIN,
                now,
                f"draining {pipe.client} closed its connection to {pipe.nsqd} with "
                f"{len(pipe.held)} message(s) never answered (they wait for timeouts)",
            )

    def _healthy(self, conn: SimConn) -> bool:
        """Nothing excuses a draining consumer that leaves messages behind on this connection:
        it is open, nothing waits behind a partition, the broker is up."""
        server = conn.server
        return (
            server is not None
            and server.alive
            and conn.state.name == "OPEN"
            and not conn.held
            and self.sim.net.reachable(conn.client.name, server.name)
        )

    # -- node events ------------------------------------------------------------------------

    def on_accepted(self, nsqd: str, topic: str, bodies: Iterable[bytes], now: float) -> None:
        """nsqd ``nsqd`` accepted ``bodies`` on ``topic``: each must reach every channel of it."""
        channels = self.sim.spec.channels_of(topic)
        for body in bodies:
            self.accepted_at.setdefault(body, now)
            for channel in channels:
                self.expected.setdefault((topic, channel, body), nsqd)

    def on_handled(self, consumer: str, delivery: Deliver, now: float) -> None:
        """The user's handler ran ``delivery`` on ``consumer`` (counted for at-least-once and
        for the redelivery figures)."""
        node = self.sim.nodes[consumer]
        key = (node.topic, node.channel, delivery.body)  # type: ignore[attr-defined]
        self.handled[key] = self.handled.get(key, 0) + 1
        self.first_handled_at.setdefault(key, now)

    def on_give_up(self, consumer: str, topic: str, channel: str, body: bytes, now: float) -> None:
        """``consumer`` gave a message up (past max_attempts): it counts as done, not lost."""
        self.given_up.add((topic, channel, body))

    def on_nsqd_down(self, nsqd: str, on_disk: dict[str, set[bytes]], now: float) -> None:
        """Messages homed on a crashed nsqd and not on its disk are excused from delivery:
        a channel's copy survives in the channel's queue or, not yet copied, the topic's."""
        empty: set[bytes] = set()
        for key, home in self.expected.items():
            if home != nsqd or key in self.finished or key in self.given_up:
                continue
            topic, channel, body = key
            if body not in on_disk.get(f"{topic}:{channel}", empty) and body not in on_disk.get(
                topic, empty
            ):
                self.excused.add(key)

    def on_drain_started(self, consumer: str, now: float) -> None:
        """``consumer`` started draining: from now on it must close no connection with
        messages unanswered."""
        self.draining.add(consumer)

    def on_drain_complete(self, consumer: str, now: float) -> None:
        """``consumer`` finished draining at ``now`` (checked against what it still held)."""
        self.drained[consumer] = now

    def on_consumer_killed(self, consumer: str, now: float) -> None:
        """``consumer`` died: a drain it had started no longer has to complete."""
        self.draining.discard(consumer)

    def on_job(self, consumer: str, body: bytes, start: float, end: float) -> None:
        """User code started on ``body`` (planned to end at ``end``)."""
        self.jobs.append((body, consumer, start, end))

    def on_lookup_request(self, lookupd: str, client: str, now: float) -> None:
        """``client`` asked ``lookupd`` for a topic's producers (the herd figures count them)."""
        self.lookup_requests.append((now, lookupd, client))

    def on_consumer_step(self, consumer: str, max_in_flight: int, now: float) -> None:
        """After each consumer step: the RDY it has sent, summed over its live connections
        (and what it holds, when messages nsqd sent blind arrived in this step)."""
        if consumer in self.check_after_step:
            self.check_after_step.discard(consumer)
            self._check_held(consumer, now)
        pipes = self._consumer_pipes.get(consumer)
        if not pipes:
            return
        total = 0
        for pipe in pipes.values():
            total += pipe.client_rdy
        limit = max_in_flight
        if total > limit:
            detail = ", ".join(f"{p.nsqd}={p.client_rdy}" for p in pipes.values())
            self.violate(
                Invariant.RDY_SUM,
                now,
                f"{consumer} RDY sum {total} > max_in_flight {limit} ({detail})",
            )

    # -- end checks -------------------------------------------------------------------------

    def outstanding(self) -> list[tuple[str, str, bytes]]:
        """Expected messages neither finished, given up nor excused (yet)."""
        done = self.finished | self.given_up | self.excused
        return [key for key in self.expected if key not in done]

    def check_final(self, now: float, *, discovery: bool = True) -> None:
        """The end-of-run invariants: every accepted message finished or given up, the brokers
        empty, drains complete (and discovery, unless ``discovery`` is False)."""
        missing = self.outstanding()
        if missing:
            sample = ", ".join(repr(k[2]) for k in missing[:5])
            self.violate(
                Invariant.AT_LEAST_ONCE,
                now,
                f"{len(missing)} accepted message(s) never finished nor given up (e.g. {sample})",
            )
        self._check_brokers(now)
        for consumer in sorted(self.draining - set(self.drained)):
            node = self.sim.nodes.get(consumer)
            if node is not None and node.alive:
                self.violate(
                    Invariant.DRAIN,
                    now,
                    f"{consumer} started a drain that never completed (no DrainComplete)",
                )
        if discovery:
            self.check_discovery(now)

    def _check_brokers(self, now: float) -> None:

        for node in self.sim.nodes.values():
            if not isinstance(node, NsqdNode) or not node.alive:
                continue
            stats = node.nsqd.stats(now, include_clients=False)
            for topic in stats["topics"]:
                for chan in topic["channels"]:
                    if chan["channel_name"] not in self.sim.spec.channels_of(topic["topic_name"]):
                        continue
                    held = chan["depth"] + chan["in_flight_count"] + chan["deferred_count"]
                    if held:
                        self.violate(
                            Invariant.BROKER_EMPTY,
                            now,
                            f"{node.name} still holds {held} message(s) on "
                            f"{topic['topic_name']}/{chan['channel_name']} "
                            f"(depth {chan['depth']}, in flight "
                            f"{chan['in_flight_count']}, deferred "
                            f"{chan['deferred_count']})",
                        )

    def check_discovery(self, now: float) -> None:
        """At the end: every live consumer that uses lookupd (and is not draining) is connected
        to exactly the live nsqd: discovery found them all once the faults healed."""
        live = {n.address for n in self.sim.nodes.values() if isinstance(n, NsqdNode) and n.alive}
        for node in self.sim.nodes.values():
            if (
                not isinstance(node, ConsumerNode)
                or not node.alive
                or not node.started
                or not node.lookupd_addresses
            ):
                continue
            if node.drain_started_at is not None:
                continue
            connected = {
                conn.address for conn in node.conn_of.values() if conn.state.name == "OPEN"
            }
            if connected != live:
                self.violate(
                    Invariant.DISCOVERY,
                    now,
                    f"{node.name} is connected to {sorted(connected)}, live nsqd are "
                    f"{sorted(live)}",
                )
