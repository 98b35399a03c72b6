"""What every simulated node is (:class:`SimNode`) and what it sees of the simulation
(:class:`World`, :class:`Hooks`).

A node needs the virtual clock and scheduler, the network, the cluster's spec, the monitor's
hooks and a way to say "my state changed" (:meth:`World.after`); the monitor needs the nodes by
name as well. Both are given the :class:`~nsq_sansio.testing.simulator.Simulator`, which builds
them; typing them against these protocols lets the nodes and the monitor be read (and imported)
without the simulator, so this package's modules import one way: clock, network, specs,
violations, nodes, invariants, simulator.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING, Protocol

from ..clock import Scheduler
from ..network import Network, SimConn
from ..specs import ClusterSpec
from ..violations import Invariant

if TYPE_CHECKING:
    from ...consumer import Deliver

__all__ = ["Hooks", "SimNode", "World"]


class SimNode:
    """Base of every simulated node: a host name, listening ports, liveness and callbacks."""

    def __init__(self, sim: World, name: str) -> None:
        self.sim = sim
        self.name = name
        self.ports: set[int] = set()
        self.alive = True
        self.timer_token = 0
        self.timer_at: float | None = None

    # network callbacks (overridden)
    def on_accept(self, conn: SimConn, now: float) -> None:
        """A client connected to one of this node's ports (``conn`` is the new connection)."""
        raise NotImplementedError

    def on_connected(self, conn: SimConn, now: float) -> None:
        """A connection this node opened is established."""
        raise NotImplementedError

    def on_connect_failed(self, conn: SimConn, now: float) -> None:
        """A connection this node opened was refused or timed out."""
        raise NotImplementedError

    def on_data(self, conn: SimConn, data: bytes, now: float) -> None:
        """``data`` arrived on ``conn`` (in whatever pieces the network cut it)."""
        raise NotImplementedError

    def on_eof(self, conn: SimConn, now: float) -> None:
        """The peer closed ``conn`` (or the network broke it)."""
        raise NotImplementedError

    def next_deadline(self) -> float | None:
        """The earliest virtual time :meth:`handle_timer` must run (None: nothing pending)."""
        return None

    def handle_timer(self, now: float) -> None:
        """Timers due at ``now``."""

    def check(self, now: float) -> None:
        """Per-step invariant hooks (overridden)."""


class Hooks(Protocol):
    """What nodes tell the monitor (:class:`~nsq_sansio.testing.invariants.Monitor`)."""

    def violate(self, invariant: Invariant, now: float, detail: str) -> None: ...

    def on_client_conn_ended(self, conn: SimConn, *, by_client: bool) -> None: ...

    def on_accepted(self, nsqd: str, topic: str, bodies: Iterable[bytes], now: float) -> None: ...

    def on_handled(self, consumer: str, delivery: Deliver, now: float) -> None: ...

    def on_give_up(
        self, consumer: str, topic: str, channel: str, body: bytes, now: float
    ) -> None: ...

    def on_nsqd_down(self, nsqd: str, on_disk: dict[str, set[bytes]], now: float) -> None: ...

    def on_drain_started(self, consumer: str, now: float) -> None: ...

    def on_drain_complete(self, consumer: str, now: float) -> None: ...

    def on_consumer_killed(self, consumer: str, now: float) -> None: ...

    def on_job(self, consumer: str, body: bytes, start: float, end: float) -> None: ...

    def on_lookup_request(self, lookupd: str, client: str, now: float) -> None: ...

    def on_consumer_step(self, consumer: str, max_in_flight: int, now: float) -> None: ...


class World(Protocol):
    """The simulation as a node or the monitor sees it."""

    @property
    def now(self) -> float: ...

    @property
    def scheduler(self) -> Scheduler: ...

    @property
    def net(self) -> Network: ...

    @property
    def spec(self) -> ClusterSpec: ...

    @property
    def monitor(self) -> Hooks: ...

    @property
    def nodes(self) -> Mapping[str, SimNode]: ...

    def after(self, node: SimNode) -> None:
        """A node's state changed outside the network's callbacks: re-arm its timer, check."""
