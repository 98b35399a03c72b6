"""What nsqd's and nsqlookupd's HTTP API answer, as frozen dataclasses: ``/stats``
(:class:`NSQDStats`, :class:`TopicStats`, :class:`ChannelStats` with its lag,
:class:`ClientStats`), ``/info``, ``/nodes``, ``/lookup``. Field names follow the API's JSON,
durations are seconds."""

from __future__ import annotations

from dataclasses import dataclass

from ..discovery import _join

__all__ = [
    "ChannelStats",
    "ClientStats",
    "E2ELatency",
    "LatencyPercentile",
    "LookupdInfo",
    "LookupdNode",
    "LookupdProducer",
    "MemoryStats",
    "NSQDInfo",
    "NSQDStats",
    "PubCount",
    "TopicLookup",
    "TopicStats",
]


@dataclass(frozen=True, slots=True)
class LatencyPercentile:
    """One end-to-end latency percentile: ``quantile`` (0.99) and its value in seconds."""

    quantile: float
    seconds: float


@dataclass(frozen=True, slots=True)
class E2ELatency:
    """End-to-end processing latency (publish to FIN) that nsqd measured over its window.

    Only when nsqd runs with ``--e2e-processing-latency-percentile``; ``count`` is how many
    messages the window saw (0: the percentiles are 0 and mean nothing yet).
    """

    count: int
    percentiles: tuple[LatencyPercentile, ...]

    def percentile(self, quantile: float) -> float | None:
        """The value in seconds at ``quantile`` (0.99), or None when nsqd does not track it."""
        for entry in self.percentiles:
            if entry.quantile == quantile:
                return entry.seconds
        return None


@dataclass(frozen=True, slots=True)
class PubCount:
    """How many messages a producer connection published to one topic."""

    topic: str
    count: int


@dataclass(frozen=True, slots=True)
class ClientStats:
    """One client connection as nsqd's ``/stats`` lists it (a consumer of a channel, or a
    producer with its ``pub_counts``)."""

    client_id: str
    hostname: str
    version: str
    remote_address: str
    #: nsqd's connection state: 0 init, 1 disconnected, 2 connected, 3 subscribed, 4 closing.
    state: int
    ready_count: int
    in_flight_count: int
    message_count: int
    finish_count: int
    requeue_count: int
    #: When it connected (Unix seconds).
    connect_ts: int
    sample_rate: int
    deflate: bool
    snappy: bool
    user_agent: str
    tls: bool
    tls_cipher_suite: str
    tls_version: str
    tls_negotiated_protocol: str
    tls_negotiated_protocol_is_mutual: bool
    authed: bool
    auth_identity: str
    auth_identity_url: str
    pub_counts: tuple[PubCount, ...]


@dataclass(frozen=True, slots=True)
class ChannelStats:
    """One channel of one nsqd, from ``/stats``.

    ``depth`` is what waits to be delivered (memory plus disk: it includes
    ``backend_depth``), ``in_flight_count`` what was delivered and not yet finished,
    ``deferred_count`` what waits for a delay (a requeue with delay or a deferred publish).
    ``message_count``, ``requeue_count`` and ``timeout_count`` count since the channel was
    created. ``topic_depth`` is the depth of its topic: messages published and not yet copied
    into the channels (a paused topic, or a backlog nsqd is still moving).
    """

    topic: str
    name: str
    depth: int
    backend_depth: int
    in_flight_count: int
    deferred_count: int
    message_count: int
    requeue_count: int
    timeout_count: int
    client_count: int
    paused: bool
    #: Per-client entries (empty when asked for without clients; ``client_count`` remains).
    clients: tuple[ClientStats, ...]
    e2e_latency: E2ELatency | None
    topic_depth: int

    @property
    def lag(self) -> int:
        """Messages published to the topic on this nsqd that this channel has not finished:
        ``topic_depth + depth + in_flight_count + deferred_count``.

        That is the consumer group's backlog in the sense of "work not done yet": waiting in
        the topic (it will reach the channel), queued in the channel (memory or disk),
        delivered but not finished (a crash would redeliver them), and deferred. It is 0
        exactly when everything published so far has been finished. Sum it over every nsqd
        of the topic (:meth:`LookupdAPI.lookup`) for the whole cluster.
        """
        return self.topic_depth + self.depth + self.in_flight_count + self.deferred_count


@dataclass(frozen=True, slots=True)
class TopicStats:
    """One topic of one nsqd, from ``/stats``: ``depth`` (memory plus disk, waiting to be
    copied into its channels), ``message_count`` and ``message_bytes`` published, its
    channels."""

    name: str
    depth: int
    backend_depth: int
    message_count: int
    message_bytes: int
    paused: bool
    channels: tuple[ChannelStats, ...]
    #: Merged over its channels, when nsqd tracks it.
    e2e_latency: E2ELatency | None

    def channel(self, name: str) -> ChannelStats | None:
        """The channel called ``name``, or None."""
        for chan in self.channels:
            if chan.name == name:
                return chan
        return None


@dataclass(frozen=True, slots=True)
class MemoryStats:
    """The Go runtime's memory figures of nsqd (``include_memory=True``)."""

    heap_objects: int
    heap_idle_bytes: int
    heap_in_use_bytes: int
    heap_released_bytes: int
    gc_pause_usec_100: int
    gc_pause_usec_99: int
    gc_pause_usec_95: int
    next_gc_bytes: int
    gc_total_runs: int


@dataclass(frozen=True, slots=True)
class NSQDStats:
    """nsqd's ``/stats``: its health, topics (sorted by name, channels too) and producers."""

    version: str
    #: ``"OK"``, or why nsqd is unhealthy (a failed disk write).
    health: str
    #: When nsqd started (Unix seconds).
    start_time: int
    topics: tuple[TopicStats, ...]
    #: Connections that published (with their ``pub_counts``).
    producers: tuple[ClientStats, ...]
    memory: MemoryStats | None

    def topic(self, name: str) -> TopicStats | None:
        """The topic called ``name``, or None."""
        for found in self.topics:
            if found.name == name:
                return found
        return None

    def channel(self, topic: str, channel: str) -> ChannelStats | None:
        """The channel ``channel`` of ``topic``, or None."""
        found = self.topic(topic)
        return None if found is None else found.channel(channel)


@dataclass(frozen=True, slots=True)
class NSQDInfo:
    """nsqd's ``/info``: version, where it listens, and the limits clients negotiate against
    (durations in seconds; fields an older nsqd leaves out are 0 or empty)."""

    version: str
    broadcast_address: str
    hostname: str
    http_port: int
    tcp_port: int
    start_time: int
    max_heartbeat_interval: float
    max_output_buffer_size: int
    max_output_buffer_timeout: float
    max_deflate_level: int


# --- answers: nsqlookupd -------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class LookupdInfo:
    """nsqlookupd's ``/info``."""

    version: str


@dataclass(frozen=True, slots=True)
class LookupdProducer:
    """An nsqd as nsqlookupd knows it: where it says it is (``broadcast_address`` and ports),
    where it registered from (``remote_address``), its version."""

    remote_address: str
    hostname: str
    broadcast_address: str
    tcp_port: int
    http_port: int
    version: str

    @property
    def tcp_address(self) -> str:
        """``broadcast_address:tcp_port``: where consumers and producers connect."""
        return _join(self.broadcast_address, self.tcp_port)

    @property
    def http_address(self) -> str:
        """``broadcast_address:http_port``: its HTTP API, and its name for tombstones."""
        return _join(self.broadcast_address, self.http_port)


@dataclass(frozen=True, slots=True)
class LookupdNode(LookupdProducer):
    """An nsqd registered with nsqlookupd (``/nodes``), with its topics; those tombstoned for
    this node are in ``tombstoned_topics`` too."""

    topics: tuple[str, ...] = ()
    tombstoned_topics: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class TopicLookup:
    """``/lookup`` for one topic: its channels (sorted) and the nsqd producing it."""

    topic: str
    channels: tuple[str, ...]
    producers: tuple[LookupdProducer, ...]
