"""A tiny in-memory world for coordinator tests: real nsqd server roles, a virtual clock.

The coordinator's actions are carried out at once (connects succeed unless the node is down),
bytes move instantly, and the "user" is a list of deliveries the test answers explicitly.
Only what the tests need; the full simulator is issue 6's.
"""

from __future__ import annotations

import random
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
        dead_letter: bool = False,
    ) -> None:
        self.now = 0.0
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
            self._timers()
            self.pump()
        self.now = end
        self._timers()
        self.pump()

    def _deadlines(self) -> list[float]:
        out = []
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
        """The nsqd process dies: every socket to it breaks."""
        address = self.addresses[node]
        self.down.add(address)
        for conn_id, (addr, server_id) in list(self.wire.items()):
            if addr == address:
                del self.wire[conn_id]
                self.wire_rdy.pop(conn_id, None)
                self.nodes[address].connection_lost(server_id, self.now)
                self.coordinator.connection_failed(conn_id, "connection reset", self.now)
        self.pump()

    def revive(self, node: int) -> None:
        self.down.discard(self.addresses[node])

    def pump(self) -> None:
        """Carry out actions and move bytes until nothing changes."""
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
                        self.coordinator.receive_data(conn_id, data, self.now)
            if not progressed:
                return
        raise AssertionError("pump did not settle")

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
            if action.final_data:
                self._to_server(action.conn_id, action.final_data)
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

    def _to_server(self, conn_id: int, data: bytes) -> None:
        wired = self.wire.get(conn_id)
        if wired is None:
            return
        address, server_id = wired
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
        for event in self.nodes[address].receive_data(server_id, data, self.now):
            self._server_event(address, event)

    def _server_event(self, address: NSQDAddress, event: object) -> None:
        if isinstance(event, server_events.CloseConnection):
            node = self.nodes[address]
            conn_id = self._client_of(address, event.conn_id)
            data = node.data_to_send(event.conn_id)
            node.connection_lost(event.conn_id, self.now)
            if conn_id is not None:
                del self.wire[conn_id]
                self.wire_rdy.pop(conn_id, None)
                if data:
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
    """Messages nsqd counts in flight on the consumer's open connections (sent, not answered,
    not timed out): what the user holds. Those of a lost connection are nsqd's again."""
    total = 0
    for node in world.nodes.values():
        stats = node.stats(world.now, topic=TOPIC, channel=CHANNEL)
        for topic in stats["topics"]:
            for channel in topic["channels"]:
                for client in channel["clients"]:
                    total += client["in_flight_count"]
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
