"""What a simulated run is made of, as plain frozen data: the cluster's shape
(:class:`ClusterSpec`, :class:`ConsumerSpec`), the publishing :class:`Workload`, the
:class:`Fault` s injected and when, and the :class:`Scenario` that holds them with the seed.
The :class:`~nsq_sansio.testing.simulator.Simulator` builds and runs a cluster from these.
"""

from __future__ import annotations

import dataclasses
import enum
from dataclasses import dataclass, field

from ..config import Config
from ..server.lookupd import LookupdOptions
from ..server.options import NSQDOptions
from .handler import Handler
from .network import LinkSpec

__all__ = [
    "FLAP_CYCLES",
    "ClusterSpec",
    "ConsumerSpec",
    "Fault",
    "FaultKind",
    "Scenario",
    "Workload",
]


@dataclass(frozen=True, slots=True)
class ConsumerSpec:
    """``count`` consumers of ``channel`` with one :class:`Config` and one handler."""

    count: int = 1
    channel: str = "archive"
    config: Config = field(
        default_factory=lambda: Config(
            max_in_flight=10,
            default_requeue_delay=1.0,
            max_requeue_delay=10.0,
            backoff_multiplier=0.5,
            max_backoff_duration=4.0,
            lookupd_poll_interval=5.0,
            reconnect_delay=0.5,
            max_reconnect_delay=5.0,
            heartbeat_interval=5.0,
        )
    )
    handler: Handler = field(default_factory=Handler)
    #: Discover nsqd through lookupd (True) or connect to every nsqd directly (False).
    use_lookupd: bool = True
    start_at: float = 0.0
    #: Pull mode: the handler loop fetch()es ``fetch_batch`` messages at a time.
    pull: bool = False
    fetch_batch: int = 10


@dataclass(frozen=True, slots=True)
class ClusterSpec:
    """The shape of a cluster: how many nodes of each kind and how they are configured."""

    nsqd: int = 1
    lookupd: int = 1
    topic: str = "events"
    consumers: tuple[ConsumerSpec, ...] = (ConsumerSpec(),)
    #: nsqd's backends survive a crash (written to disk, and ``mem_queue_size`` 0 so every
    #: message is on disk until delivered), like ``--mem-queue-size=0`` with a disk queue.
    durable: bool = True
    nsqd_options: NSQDOptions = field(
        default_factory=lambda: NSQDOptions(
            msg_timeout=10.0,
            max_msg_timeout=60.0,
            client_timeout=10.0,
            max_req_timeout=60.0,
        )
    )
    lookupd_options: LookupdOptions = field(
        default_factory=lambda: LookupdOptions(
            inactive_producer_timeout=30.0,
            tombstone_lifetime=10.0,
        )
    )
    link: LinkSpec = field(default_factory=LinkSpec)
    lookup_ping_interval: float = 5.0

    def channels_of(self, topic: str) -> tuple[str, ...]:
        """The channels consumers subscribe to on ``topic``, in order (none for another
        topic)."""
        if topic != self.topic:
            return ()
        seen: dict[str, None] = {}
        for consumer in self.consumers:
            seen.setdefault(consumer.channel, None)
        return tuple(seen)

    def topics_channels(self) -> list[tuple[str, tuple[str, ...]]]:
        """The topic with its channels, as nsqd registers them with lookupd."""
        return [(self.topic, self.channels_of(self.topic))]


@dataclass(frozen=True, slots=True)
class Workload:
    """``messages`` bodies published at ``rate`` per second from ``start``, ``batch`` per
    publish (MPUB when > 1), spread round-robin over the nsqd; over TCP producers when
    ``via_tcp``, else through nsqd's HTTP API (accepted at once)."""

    messages: int = 100
    rate: float = 100.0
    batch: int = 1
    start: float = 1.0
    via_tcp: bool = True
    #: Indexes of the nsqd to publish to (round-robin); empty: all of them.
    targets: tuple[int, ...] = ()
    #: Pad every body to this many bytes (``b"m<n>."`` then filler); 0: no padding.
    body_size: int = 0


class FaultKind(enum.Enum):
    """What a fault does to its target (the comment on each member says how it ends)."""

    DROP_CONNECTIONS = "drop"  # reset every connection of a node
    PARTITION = "partition"  # cut a node off from everyone for ``duration``
    CRASH = "crash"  # kill a node (nsqd loses what is not on disk), restart after ``duration``
    STOP = "stop"  # clean shutdown of an nsqd (everything to disk), restart after ``duration``
    KILL_CONSUMER = "kill_consumer"  # a consumer dies; a new one replaces it after ``duration``
    DRAIN_CONSUMER = "drain_consumer"  # a consumer drains; a new one replaces it after ``duration``
    #: cut a node off for ``duration``, reconnect it for ``duration``, FLAP_CYCLES times over
    FLAP = "flap"


#: How many times a :attr:`FaultKind.FLAP` cuts its node off.
FLAP_CYCLES = 3


@dataclass(frozen=True, slots=True)
class Fault:
    """One fault of a schedule: ``kind`` applied to node ``target`` at ``at`` seconds, for
    ``duration`` seconds."""

    at: float
    kind: FaultKind
    target: str
    duration: float = 5.0


@dataclass(frozen=True, slots=True)
class Scenario:
    """Everything a run depends on (with the seed)."""

    cluster: ClusterSpec = field(default_factory=ClusterSpec)
    workload: Workload = field(default_factory=Workload)
    faults: tuple[Fault, ...] = ()
    #: Faults happen before this; then everything heals and the run settles.
    duration: float = 30.0
    #: Longest settle phase after ``duration`` (simulated seconds).
    settle: float = 600.0
    seed: int = 0

    def with_handler(self, handler: Handler) -> Scenario:
        """The same run with ``handler`` in every consumer (to test your own handler)."""
        consumers = tuple(dataclasses.replace(c, handler=handler) for c in self.cluster.consumers)
        return dataclasses.replace(
            self, cluster=dataclasses.replace(self.cluster, consumers=consumers)
        )
