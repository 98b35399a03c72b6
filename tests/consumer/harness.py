"""A tiny in-memory world for coordinator tests: real nsqd server roles, a virtual clock.

The coordinator's actions are carried out at once (connects succeed unless the node is down),
and the "user" is a list of deliveries the test answers explicitly. Bytes move instantly, or,
with ``latency``, wait in each connection's two FIFO pipes: a test (or a stateful rule)
delivers the head of any pipe early (so connections reorder), and time never moves past a
chunk's due time without delivering it (the latency bound the coordinator's settle time
assumes). :meth:`World.stall` holds a node's bytes until :meth:`World.heal` (a partition,
which breaks that bound). The full simulator is :mod:`nsq_sansio.testing`.
"""

from __future__ import annotations

import random
from collections import deque
from collections.abc import Iterable

from nsq_sansio.config import Config
from nsq_sansio.consumer import (
    Action,
    CloseConnection,
    CloseHTTPRequest,
    Connect,
    ConsumerCoordinator,
    DeadLetter,
    Deliver,
    FetchResult,
    SendHTTPRequest,
)
from nsq_sansio.discovery import NSQDAddress
from nsq_sansio.server import events as server_events
from nsq_sansio.server.nsqd import NSQD
from nsq_sansio.server.options import NSQDOptions

TOPIC, CHANNEL = "events", "work"

#: Pipe directions: what the coordinator wrote to nsqd, what nsqd wrote to the coordinator.
TO_SERVER, TO_CLIENT = 0, 1


class World:
    """nsqd nodes + one coordinator, wired through memory."""

    def __init__(
        self,
        n_nodes: int = 1,
        config: Config | None = None,
        *,
        seed: int = 0,
        pull: bool = False,
        lookupd: Iterable[str] = (),
        direct: bool = True,
        node_options: dict[str, object] | None = None,
        latency: float = 0.0,
        dead_letter: bool = False,
    ) -> None:
        self.now = 0.0
        #: The longest a chunk waits in a pipe (0: bytes move at once).
        self.latency = latency
        #: (conn_id, direction) -> chunks on their way: (due time, bytes), oldest first.
        self.pipes: dict[tuple[int, int], deque[tuple[float, bytes]]] = {}
        #: Nodes cut off: their pipes hold everything until heal().
        self.stalled: set[NSQDAddress] = set()
        #: FIN commands nsqd read (those lost with a broken connection never count), and
        #: those it refused (E_FIN_FAILED: the message was no longer in flight there), as
        #: nsqd wrote them (the client may never read the refusal: its connection broke).
        self.fins_read = 0
        self.fins_refused = 0
        self.addresses = [NSQDAddress(f"10.0.0.{i + 1}", 4150) for i in range(n_nodes)]
        options = NSQDOptions(**(node_options or {}))  # type: ignore[arg-type]
        self.nodes: dict[NSQDAddress, NSQD] = {
            a: NSQD(options, random.Random(seed + i), now=0.0) for i, a in enumerate(self.addresses)
        }
        self.down: set[NSQDAddress] = set()
        self.coordinator = ConsumerCoordinator(
            TOPIC,
            CHANNEL,
            config or Config(),
            rng=random.Random(seed),
            nsqd=[str(a) for a in self.addresses] if direct else (),
            lookupd=lookupd,
            pull=pull,
            dead_letter=dead_letter,
        )
        #: DeadLetter actions not reported on yet, in order.
        self.dead_letters: list[Deliver] = []
        self.wire: dict[int, tuple[NSQDAddress, int]] = {}  # conn_id -> (node, server conn)
        self.actions: list[Action] = []
        self.inbox: list[Deliver] = []
        self.results: list[FetchResult] = []
        self.http: dict[int, SendHTTPRequest] = {}
        self.rdy_sent: list[tuple[int, int]] = []
        self.sent: list[tuple[int, bytes]] = []  # (conn_id, command line) client -> nsqd
        #: RDY as written on each wire, and raises that took the written sum over budget.
        self.wire_rdy: dict[int, int] = {}
        self.over_budget: list[tuple[float, int, int]] = []
        for node in self.nodes.values():
            node.create_topic(TOPIC, 0.0)
            node.create_channel(TOPIC, CHANNEL, 0.0)

    # --- driving ---------------------------------------------------------------------------

    def start(self) -> None:
        self.coordinator.start(self.now)
        self.pump()

    def publish(self, node: int, count: int = 1, body: bytes = b"x") -> None:
        address = self.addresses[node]
        for _ in range(count):
            self.nodes[address].publish(TOPIC, body, self.now)
        self.pump()

    def advance(self, seconds: float) -> None:
        """Move the clock, firing every timer due on the way, in order."""
        end = self.now + seconds
        while True:
            due = [d for d in self._deadlines() if d <= end]
            if not due:
                break
            self.now = max(self.now, min(due))
            self.deliver_due()
            self._timers()
            self.pump()
        self.now = end
        self.deliver_due()
        self._timers()
        self.pump()

    def _deadlines(self) -> list[float]:
        out = []
        for (conn_id, _), pipe in self.pipes.items():
            if pipe and not self._is_stalled(conn_id):
                out.append(pipe[0][0])
        d = self.coordinator.next_deadline()
        if d is not None:
            out.append(d)
        for node in self.nodes.values():
            nd = node.next_deadline()
            if nd is not None:
                out.append(nd)
        return out

    def _timers(self) -> None:
        self.coordinator.handle_timer(self.now)
        for address, node in self.nodes.items():
            for event in node.handle_timer(self.now):
                self._server_event(address, event)

    def kill(self, node: int) -> None:
        """The nsqd process dies: every socket to it breaks (bytes on the way are lost)."""
        address = self.addresses[node]
        self.down.add(address)
        for conn_id, (addr, server_id) in list(self.wire.items()):
            if addr == address:
                del self.wire[conn_id]
                self.wire_rdy.pop(conn_id, None)
                self._drop_pipes(conn_id)
                self.nodes[address].connection_lost(server_id, self.now)
                self.coordinator.connection_failed(conn_id, "connection reset", self.now)
        self.pump()

    def revive(self, node: int) -> None:
        self.down.discard(self.addresses[node])

    def stall(self, node: int) -> None:
        """Cut ``node`` off (a partition): bytes to and from it wait until :meth:`heal`."""
        self.stalled.add(self.addresses[node])

    def heal(self, node: int) -> None:
        """End :meth:`stall`: what waited arrives at once, in order."""
        self.stalled.discard(self.addresses[node])
        self.deliver_due()
        self.pump()

    def pump(self) -> None:
        """Carry out actions and move bytes until nothing changes (with ``latency``, bytes
        only enter the pipes here: :meth:`deliver` and time move them on)."""
        for _ in range(10_000):
            progressed = False
            for action in self.coordinator.take_actions():
                progressed = True
                self.actions.append(action)
                self._act(action)
            for conn_id, data in self.coordinator.pending_data():
                progressed = True
                self._to_server(conn_id, data)
            for address, node in self.nodes.items():
                for server_id in node.connections_with_output():
                    data = node.data_to_send(server_id)
                    conn_id = self._client_of(address, server_id)
                    if data and conn_id is not None:
                        progressed = True
                        self.fins_refused += data.count(b"E_FIN_FAILED")
                        self._send(conn_id, TO_CLIENT, data)
            if not progressed:
                return
        raise AssertionError("pump did not settle")

    # --- pipes -----------------------------------------------------------------------------

    def in_transit(self) -> list[tuple[int, int]]:
        """The pipes with bytes on the way that can move now: (conn_id, direction), sorted."""
        return sorted(
            key for key, pipe in self.pipes.items() if pipe and not self._is_stalled(key[0])
        )

    def deliver(self, key: tuple[int, int]) -> None:
        """The oldest chunk of one pipe arrives now (before its due time: a fast path)."""
        pipe = self.pipes.get(key)
        if pipe and not self._is_stalled(key[0]):
            _, data = pipe.popleft()
            self._arrive(key[0], key[1], data)
            self.pump()

    def deliver_due(self) -> None:
        """Every chunk due by now arrives (each pipe in order)."""
        while True:
            due = [
                key
                for key, pipe in self.pipes.items()
                if pipe and pipe[0][0] <= self.now and not self._is_stalled(key[0])
            ]
            if not due:
                return
            for key in sorted(due):
                self.deliver(key)

    def deliver_all(self) -> None:
        """Everything on the way arrives (but what a stalled node holds)."""
        while self.in_transit():
            for key in self.in_transit():
                self.deliver(key)

    def answers_in_transit(self, conn_id: int) -> int:
        """FIN and REQ the coordinator wrote on ``conn_id`` that nsqd has not read yet."""
        pipe = self.pipes.get((conn_id, TO_SERVER), ())
        return sum(
            1
            for _, data in pipe
            for line in data.split(b"\n")
            if line.startswith((b"FIN ", b"REQ "))
        )

    def _is_stalled(self, conn_id: int) -> bool:
        wired = self.wire.get(conn_id)
        return wired is not None and wired[0] in self.stalled

    def _send(self, conn_id: int, direction: int, data: bytes) -> None:
        key = (conn_id, direction)
        pipe = self.pipes.get(key)
        if not pipe and not self.latency and not self._is_stalled(conn_id):
            self._arrive(conn_id, direction, data)
            return
        if pipe is None:
            pipe = self.pipes[key] = deque()
        pipe.append((self.now + self.latency, data))

    def _arrive(self, conn_id: int, direction: int, data: bytes) -> None:
        wired = self.wire.get(conn_id)
        if wired is None:
            return
        if direction == TO_CLIENT:
            self.coordinator.receive_data(conn_id, data, self.now)
            return
        address, server_id = wired
        self.fins_read += sum(1 for line in data.split(b"\n") if line.startswith(b"FIN "))
        for event in self.nodes[address].receive_data(server_id, data, self.now):
            self._server_event(address, event)

    def _drop_pipes(self, conn_id: int) -> None:
        self.pipes.pop((conn_id, TO_SERVER), None)
        self.pipes.pop((conn_id, TO_CLIENT), None)

    def _flush_to_server(self, conn_id: int) -> None:
        """A closing client: what it wrote still reaches nsqd first."""
        pipe = self.pipes.pop((conn_id, TO_SERVER), None)
        while pipe:
            self._arrive(conn_id, TO_SERVER, pipe.popleft()[1])
        self.pipes.pop((conn_id, TO_CLIENT), None)

    def _client_of(self, address: NSQDAddress, server_id: int) -> int | None:
        for conn_id, (addr, sid) in self.wire.items():
            if addr == address and sid == server_id:
                return conn_id
        return None

    def _act(self, action: Action) -> None:
        c = self.coordinator
        if isinstance(action, Connect):
            if action.address in self.down or action.address not in self.nodes:
                c.connection_failed(action.conn_id, "connection refused", self.now)
                return
            server_id = self.nodes[action.address].connect(self.now, f"10.9.9.9:{action.conn_id}")
            self.wire[action.conn_id] = (action.address, server_id)
            c.connection_made(action.conn_id, self.now)
        elif isinstance(action, CloseConnection):
            self._flush_to_server(action.conn_id)
            if action.final_data:
                self._to_server(action.conn_id, action.final_data, at_once=True)
            wired = self.wire.pop(action.conn_id, None)
            self.wire_rdy.pop(action.conn_id, None)
            if wired is not None:
                self.nodes[wired[0]].connection_lost(wired[1], self.now)
        elif isinstance(action, Deliver):
            self.inbox.append(action)
        elif isinstance(action, FetchResult):
            self.results.append(action)
        elif isinstance(action, DeadLetter):
            self.dead_letters.append(action.delivery)
        elif isinstance(action, SendHTTPRequest):
            self.http[action.request_id] = action
        elif isinstance(action, CloseHTTPRequest):
            self.http.pop(action.request_id, None)

    def _to_server(self, conn_id: int, data: bytes, *, at_once: bool = False) -> None:
        """The coordinator wrote ``data`` on ``conn_id`` (recorded now, read by nsqd when it
        arrives)."""
        if conn_id not in self.wire:
            return
        for line in data.split(b"\n"):
            if line.startswith(b"RDY "):
                count = int(line[4:])
                self.rdy_sent.append((conn_id, count))
                raised = count > self.wire_rdy.get(conn_id, 0)
                self.wire_rdy[conn_id] = count
                total = sum(self.wire_rdy.values())
                if raised and total > self.coordinator.max_in_flight:
                    self.over_budget.append((self.now, total, self.coordinator.max_in_flight))
            if line[:4] in (b"RDY ", b"FIN ", b"REQ ", b"TOUC", b"CLS", b"SUB "):
                self.sent.append((conn_id, line))
        if at_once:
            self._arrive(conn_id, TO_SERVER, data)
        else:
            self._send(conn_id, TO_SERVER, data)

    def _server_event(self, address: NSQDAddress, event: object) -> None:
        if isinstance(event, server_events.CloseConnection):
            # nsqd closes: what it wrote, then EOF, reach the client at once (in order).
            node = self.nodes[address]
            conn_id = self._client_of(address, event.conn_id)
            data = node.data_to_send(event.conn_id)
            node.connection_lost(event.conn_id, self.now)
            if conn_id is not None:
                pending = self.pipes.pop((conn_id, TO_CLIENT), deque())
                self.pipes.pop((conn_id, TO_SERVER), None)
                del self.wire[conn_id]
                self.wire_rdy.pop(conn_id, None)
                for _, chunk in pending:
                    self.coordinator.receive_data(conn_id, chunk, self.now)
                if data:
                    self.fins_refused += data.count(b"E_FIN_FAILED")
                    self.coordinator.receive_data(conn_id, data, self.now)
                self.coordinator.receive_data(conn_id, b"", self.now)

    # --- the user --------------------------------------------------------------------------

    def finish_all(self) -> None:
        while self.inbox:
            self.coordinator.finish(self.inbox.pop(0), self.now)
            self.pump()

    def server_in_flight(self) -> int:
        total = 0
        for node in self.nodes.values():
            stats = node.stats(self.now, topic=TOPIC, channel=CHANNEL, include_clients=False)
            for topic in stats["topics"]:
                for channel in topic["channels"]:
                    total += channel["in_flight_count"]
        return total

    def server_depth(self) -> int:
        total = 0
        for node in self.nodes.values():
            stats = node.stats(self.now, topic=TOPIC, channel=CHANNEL, include_clients=False)
            for topic in stats["topics"]:
                for channel in topic["channels"]:
                    total += channel["depth"] + channel["deferred_count"]
        return total

    def rdy_by_conn(self) -> dict[int, int]:
        c = self.coordinator
        out = {}
        for conn_id in c.connection_ids():
            info = c.link_info(conn_id)
            assert info is not None
            out[conn_id] = info[1]
        return out

    def lines(self, prefix: bytes) -> list[bytes]:
        return [line for _, line in self.sent if line.startswith(prefix)]

    def of_type(self, kind: type) -> list[object]:
        return [a for a in self.actions if isinstance(a, kind)]


def held_by_connected_clients(world: World) -> int:
    """Messages nsqd counts in flight on the consumer's open connections (sent, not timed
    out), less the answers on their way to nsqd: what the user holds. Those of a lost
    connection are nsqd's again."""
    total = 0
    for node in world.nodes.values():
        stats = node.stats(world.now, topic=TOPIC, channel=CHANNEL)
        for topic in stats["topics"]:
            for channel in topic["channels"]:
                for client in channel["clients"]:
                    total += client["in_flight_count"]
                    if world.pipes:
                        conn_id = int(client["remote_address"].rsplit(":", 1)[1])
                        total -= world.answers_in_transit(conn_id)
    return total


def server_ready_counts(world: World) -> dict[int, int]:
    """conn_id -> the RDY count nsqd holds for that client (from its stats)."""
    out: dict[int, int] = {}
    for node in world.nodes.values():
        stats = node.stats(world.now, topic=TOPIC, channel=CHANNEL)
        for topic in stats["topics"]:
            for channel in topic["channels"]:
                for client in channel["clients"]:
                    conn_id = int(client["remote_address"].rsplit(":", 1)[1])
                    out[conn_id] = client["ready_count"]
    return out
