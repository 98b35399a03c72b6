"""Hypothesis strategies for simulated clusters: shapes, workloads, fault schedules, scenarios.

Needs ``hypothesis`` (the ``test`` extra); nothing else in :mod:`nsq_sansio` imports this module.
Every scenario drawn here is replayable from the one line an :class:`InvariantViolation` prints::

    from hypothesis import given
    from nsq_sansio.testing import run_scenario
    from nsq_sansio.testing.strategies import scenarios

    @given(scenarios())
    def test_cluster(scenario):
        run_scenario(scenario)
"""

from __future__ import annotations

import dataclasses
from typing import Any

from hypothesis import strategies as st

from ..config import Config
from .handler import Handler
from .network import LinkSpec
from .specs import ClusterSpec, ConsumerSpec, Fault, FaultKind, Scenario, Workload

__all__ = [
    "cluster_specs",
    "consumer_configs",
    "consumer_specs",
    "fault_schedules",
    "handlers",
    "link_specs",
    "scenarios",
    "workloads",
]

SearchStrategy = st.SearchStrategy


def link_specs() -> SearchStrategy[LinkSpec]:
    """Latency from LAN to WAN, jitter (reorders connections), optional bandwidth limits,
    writes split into small segments (frames cut anywhere)."""
    return st.builds(
        LinkSpec,
        latency=st.sampled_from([0.0001, 0.0005, 0.005, 0.05]),
        jitter=st.sampled_from([0.0, 0.0005, 0.01, 0.05]),
        bandwidth=st.sampled_from([None, None, 1e6, 1e8]),
        connect_timeout=st.sampled_from([0.5, 2.0]),
        segment=st.sampled_from([None, None, 5, 64, 1460]),
    )


def handlers(
    *, max_duration: float = 2.0, long_job: float = 15.0, hangs: bool = False
) -> SearchStrategy[Handler]:
    """Simulated user code: durations up to ``max_duration`` (kept under the cluster's
    msg_timeout), and with keepalive also ``long_job`` (past msg_timeout, under
    max_msg_timeout); failures, concurrency limits; with ``hangs``, rare jobs that never
    answer (a stuck worker)."""

    def build(keepalive: bool) -> SearchStrategy[Handler]:
        durations = [0.0, 0.001, 0.05, 0.5, max_duration] + ([long_job] if keepalive else [])
        return st.builds(
            Handler,
            duration=st.sampled_from(durations),
            jitter=st.sampled_from([0.0, 0.01, 0.2]),
            failure_rate=st.sampled_from([0.0, 0.0, 0.05, 0.3]),
            keepalive=st.just(keepalive),
            backoff=st.booleans(),
            concurrency=st.sampled_from([None, 1, 4]),
            hang_rate=st.sampled_from([0.0, 0.0, 0.0, 0.02] if hangs else [0.0]),
        )

    return st.booleans().flatmap(build)


def consumer_configs() -> SearchStrategy[Config]:
    """Consumer configurations that exercise RDY spreading, backoff and discovery."""
    return st.builds(
        Config,
        max_in_flight=st.sampled_from([1, 2, 3, 5, 10, 50]),
        max_attempts=st.sampled_from([0, 3, 5]),
        default_requeue_delay=st.sampled_from([0.0, 0.5, 2.0]),
        max_requeue_delay=st.just(10.0),
        backoff_enabled=st.booleans(),
        backoff_multiplier=st.sampled_from([0.1, 0.5]),
        max_backoff_duration=st.sampled_from([1.0, 4.0]),
        lookupd_poll_interval=st.sampled_from([1.0, 5.0]),
        lookupd_poll_jitter=st.sampled_from([0.0, 0.3]),
        lookupd_poll_timeout=st.just(5.0),
        reconnect_delay=st.sampled_from([0.1, 1.0]),
        max_reconnect_delay=st.just(5.0),
        low_rdy_idle_timeout=st.sampled_from([1.0, 3.0]),
        rdy_redistribute_interval=st.sampled_from([0.5, 2.0]),
        drain_timeout=st.sampled_from([2.0, 10.0]),
        heartbeat_interval=st.just(5.0),
    )


def _workable(spec: ConsumerSpec, msg_timeout: float) -> ConsumerSpec:
    """Drop a concurrency limit under which buffered messages would wait out nsqd's
    msg_timeout before their job even starts (max_in_flight / concurrency jobs of
    ``duration`` each): that consumer would livelock on redeliveries, a configuration error
    the simulator shows (see docs/simulator.md) but not what these properties are about."""
    handler = spec.handler
    if handler.concurrency is None or callable(handler.duration):
        return spec
    queue = spec.config.max_in_flight / handler.concurrency
    if queue * (handler.duration + handler.jitter) < msg_timeout / 2:
        return spec
    return dataclasses.replace(spec, handler=dataclasses.replace(handler, concurrency=None))


def consumer_specs(
    *, max_count: int = 3, msg_timeout: float = 10.0, hangs: bool = False
) -> SearchStrategy[ConsumerSpec]:
    """Consumer groups whose handlers can keep up with nsqd's ``msg_timeout``."""
    return st.builds(
        ConsumerSpec,
        count=st.integers(1, max_count),
        channel=st.sampled_from(["archive", "audit"]),
        config=consumer_configs(),
        handler=handlers(hangs=hangs),
        use_lookupd=st.booleans(),
        start_at=st.sampled_from([0.0, 0.0, 3.0]),
        pull=st.sampled_from([False, False, True]),
        fetch_batch=st.sampled_from([1, 10]),
    ).map(lambda spec: _workable(spec, msg_timeout))


def cluster_specs(
    *, max_nsqd: int = 4, max_lookupd: int = 2, hangs: bool = False
) -> SearchStrategy[ClusterSpec]:
    """1..max_nsqd nsqd, 1..max_lookupd lookupd, one or two consumer groups."""
    return st.builds(
        ClusterSpec,
        nsqd=st.integers(1, max_nsqd),
        lookupd=st.integers(1, max_lookupd),
        consumers=st.lists(consumer_specs(hangs=hangs), min_size=1, max_size=2).map(tuple),
        durable=st.booleans(),
        link=link_specs(),
    )


def workloads(*, max_messages: int = 200) -> SearchStrategy[Workload]:
    """Hypothesis strategy of workloads: message counts up to ``max_messages``, rates,
    batch sizes, start times, over TCP or HTTP."""
    return st.builds(
        Workload,
        messages=st.integers(0, max_messages),
        rate=st.sampled_from([10.0, 100.0, 1000.0]),
        batch=st.sampled_from([1, 1, 5, 20]),
        start=st.sampled_from([0.5, 2.0]),
        via_tcp=st.booleans(),
    )


_BROKER_FAULTS = [
    FaultKind.DROP_CONNECTIONS,
    FaultKind.PARTITION,
    FaultKind.CRASH,
    FaultKind.STOP,
    FaultKind.FLAP,
]
_LOOKUPD_FAULTS = [
    FaultKind.DROP_CONNECTIONS,
    FaultKind.PARTITION,
    FaultKind.CRASH,
    FaultKind.FLAP,
]
_CONSUMER_FAULTS = [
    FaultKind.DROP_CONNECTIONS,
    FaultKind.PARTITION,
    FaultKind.KILL_CONSUMER,
    FaultKind.DRAIN_CONSUMER,
    FaultKind.FLAP,
]
#: Fault lengths: blips that heal in the middle of whatever was under way (a fetch, a drain,
#: a backoff test, a handshake), up to outages longer than nsqd's heartbeat timeout.
_LENGTHS = [0.05, 0.2, 0.5, 3.0, 15.0]


# The composites below are decorated once, at import. Hypothesis checks each decorated
# function's source (read from the file on disk) for a use of ``draw``; decorating them inside
# ``fault_schedules``, which runs on every scenario drawn, repeated that check per example, and
# once the file on disk no longer matched the running code (edited or checked out during a long
# soak) it found the wrong lines and warned (HypothesisDeprecationWarning) on every example.


@st.composite
def _one_fault(
    draw: Any,
    times: SearchStrategy[float],
    nsqds: list[str],
    lookupds: list[str],
    consumers: list[str],
) -> tuple[Fault, ...]:
    """One fault on one node, of a kind that node can have."""
    at = draw(times)
    length = draw(st.sampled_from(_LENGTHS))
    group = draw(st.sampled_from(["nsqd", "lookupd", "consumer"]))
    if group == "nsqd":
        kind = draw(st.sampled_from(_BROKER_FAULTS))
        return (Fault(at, kind, draw(st.sampled_from(nsqds)), length),)
    if group == "lookupd":
        kind = draw(st.sampled_from(_LOOKUPD_FAULTS))
        return (Fault(at, kind, draw(st.sampled_from(lookupds)), length),)
    kind = draw(st.sampled_from(_CONSUMER_FAULTS))
    return (Fault(at, kind, draw(st.sampled_from(consumers)), length),)


@st.composite
def _drain_under_partition(
    draw: Any, times: SearchStrategy[float], nsqds: list[str], consumers: list[str]
) -> tuple[Fault, ...]:
    """A consumer drains while it, or an nsqd, is cut off; the cut heals mid-drain."""
    at = draw(times)
    consumer = draw(st.sampled_from(consumers))
    cut = draw(st.sampled_from([consumer, *nsqds]))
    before = draw(st.sampled_from([0.0, 0.3, 1.0]))
    heals_after = draw(st.sampled_from([0.05, 0.5, 1.5]))
    restart = draw(st.sampled_from([1.0, 5.0]))
    return (
        Fault(round(max(0.0, at - before), 3), FaultKind.PARTITION, cut, before + heals_after),
        Fault(at, FaultKind.DRAIN_CONSUMER, consumer, restart),
    )


@st.composite
def _restart_behind_partition(
    draw: Any, times: SearchStrategy[float], nsqds: list[str]
) -> tuple[Fault, ...]:
    """An nsqd cut off, then crashed (or stopped) and back on the same address before or
    after the partition heals: its clients' old connections die unseen."""
    at = draw(times)
    nsqd = draw(st.sampled_from(nsqds))
    cut = draw(st.sampled_from([0.5, 3.0, 15.0]))
    down_after = draw(st.sampled_from([0.05, 0.3]))
    down_for = draw(st.sampled_from([0.05, 0.5, 5.0]))
    kind = draw(st.sampled_from([FaultKind.CRASH, FaultKind.STOP]))
    return (
        Fault(at, FaultKind.PARTITION, nsqd, cut),
        Fault(round(at + down_after, 3), kind, nsqd, down_for),
    )


def fault_schedules(
    cluster: ClusterSpec, *, duration: float = 30.0, max_faults: int = 4
) -> SearchStrategy[tuple[Fault, ...]]:
    """Faults on the nodes of ``cluster`` at times within ``duration``: single faults (blips to
    long outages, flapping links), and combinations that make a fault heal while something
    else is under way: a partition ending during a drain of that consumer, an nsqd restarted
    on the same address while a partition still hides its old connections."""
    nsqds = [f"nsqd{i}" for i in range(cluster.nsqd)]
    lookupds = [f"lookupd{i}" for i in range(cluster.lookupd)]
    consumers = [f"c{g}.{i}" for g, spec in enumerate(cluster.consumers) for i in range(spec.count)]
    times = st.floats(0.5, duration - 0.5, allow_nan=False).map(lambda x: round(x, 3))
    groups = st.one_of(
        _one_fault(times, nsqds, lookupds, consumers),
        _one_fault(times, nsqds, lookupds, consumers),
        _one_fault(times, nsqds, lookupds, consumers),
        _drain_under_partition(times, nsqds, consumers),
        _restart_behind_partition(times, nsqds),
    )
    return st.lists(groups, max_size=max_faults).map(
        lambda parts: tuple(
            sorted((fault for part in parts for fault in part), key=lambda f: f.at)[:max_faults]
        )
    )


@st.composite
def _scenarios(
    draw: Any, max_nsqd: int, max_messages: int, max_faults: int, duration: float, hangs: bool
) -> Scenario:
    cluster = draw(cluster_specs(max_nsqd=max_nsqd, hangs=hangs))
    return Scenario(
        cluster=cluster,
        workload=draw(workloads(max_messages=max_messages)),
        faults=draw(fault_schedules(cluster, duration=duration, max_faults=max_faults)),
        duration=duration,
        seed=draw(st.integers(0, 2**32 - 1)),
    )


def scenarios(
    *,
    max_nsqd: int = 4,
    max_messages: int = 200,
    max_faults: int = 4,
    duration: float = 30.0,
    hangs: bool = False,
) -> SearchStrategy[Scenario]:
    """Whole runs: a cluster, a workload, a fault schedule and a seed. ``hangs`` adds handlers
    that, rarely, never answer a message (stuck workers)."""
    result: SearchStrategy[Scenario] = _scenarios(
        max_nsqd, max_messages, max_faults, duration, hangs
    )
    return result
