"""How long a transport may leave a connection unread (``read_pause_limit``), and why.

Transports stop reading while more messages wait for user code than ``max_in_flight``. The RDY
bound counts a message as possibly timed out on nsqd from when it was *read*: a message read
late, together with the one nsqd sent when it timed the first out, would look like nsqd going
over RDY. The limit keeps every pause well inside half the message timeout (and heartbeats
answered): against the real nsqd role, with user code that answers nothing for many message
timeouts and reads at the limit, the connection is never refused; read much later, it would be.
"""

from __future__ import annotations

from nsq_sansio.config import Config
from nsq_sansio.consumer import Disconnected
from nsq_sansio.errors import ReadyCountExceeded

from .harness import World


class PausedReads(World):
    """The world, except that what nsqd writes waits in the socket until :meth:`read`."""

    def __init__(self, *args: object, **kwargs: object) -> None:
        self.unread: dict[int, bytearray] = {}
        self.reading = True
        super().__init__(*args, **kwargs)  # type: ignore[arg-type]

    def pump(self) -> None:
        if self.reading:
            super().pump()
            return
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
                        self.unread.setdefault(conn_id, bytearray()).extend(data)
            if not progressed:
                return
        raise AssertionError("pump did not settle")

    def read(self) -> None:
        """The transport's read after a pause: everything that waited, in one go."""
        for conn_id, data in list(self.unread.items()):
            if data:
                self.unread[conn_id] = bytearray()
                self.coordinator.receive_data(conn_id, bytes(data), self.now)
        self.pump()


def stuck_consumer(msg_timeout: float, heartbeat: float) -> tuple[PausedReads, int]:
    """Subscribed, RDY 5, 200 messages waiting on nsqd; reads paused from now on."""
    world = PausedReads(
        1,
        Config(max_in_flight=5, heartbeat_interval=heartbeat),
        node_options={"msg_timeout": msg_timeout},
    )
    world.start()
    world.publish(0, 200)
    world.advance(0.1)
    (conn_id,) = world.coordinator.connection_ids()
    assert len(world.inbox) == 5
    world.reading = False
    return world, conn_id


def refusals(world: World) -> list[object]:
    return [
        a
        for a in world.actions
        if isinstance(a, Disconnected) and isinstance(a.error, ReadyCountExceeded)
    ]


def test_the_limit_is_a_quarter_of_the_timeout_or_half_a_heartbeat_interval() -> None:
    world, conn_id = stuck_consumer(msg_timeout=60.0, heartbeat=30.0)
    assert world.coordinator.read_pause_limit(conn_id) == 15.0
    world, conn_id = stuck_consumer(msg_timeout=60.0, heartbeat=4.0)
    assert world.coordinator.read_pause_limit(conn_id) == 2.0
    world, conn_id = stuck_consumer(msg_timeout=2.0, heartbeat=30.0)
    assert world.coordinator.read_pause_limit(conn_id) == 0.5
    assert world.coordinator.read_pause_limit(conn_id + 1) is None  # no such connection


def test_a_handshake_is_never_paused() -> None:
    world = World(1, Config(max_in_flight=5))
    world.coordinator.start(0.0)
    (connect,) = world.coordinator.take_actions()
    assert world.coordinator.read_pause_limit(connect.conn_id) is None  # type: ignore[attr-defined]


def test_reads_at_the_limit_while_nsqd_times_messages_out_are_never_refused() -> None:
    """Ten minutes of a user answering nothing, with a 20 s message timeout: nsqd times the
    messages out and sends others, and the transport reads only every ``read_pause_limit``."""
    world, conn_id = stuck_consumer(msg_timeout=20.0, heartbeat=30.0)
    limit = world.coordinator.read_pause_limit(conn_id)
    assert limit == 5.0
    for _ in range(int(600 / limit)):
        world.advance(limit)
        world.read()
    assert not refusals(world), refusals(world)[0]
    assert conn_id in world.coordinator.connection_ids()
    assert len(world.inbox) > 100  # nsqd kept sending: every pause had something to read


def test_reads_far_beyond_the_limit_would_be_refused() -> None:
    """The same, read every two and a half message timeouts: one read then holds a message
    and the ones nsqd sent after timing it out, more than the bound allows (the limit is
    what prevents this; heartbeats are made rare so that they do not end it first)."""
    world, _ = stuck_consumer(msg_timeout=20.0, heartbeat=60.0)
    for _ in range(10):
        world.advance(50.0)
        world.read()
        if refusals(world):
            break
    assert refusals(world)
