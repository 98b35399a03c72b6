"""Known failure modes of long-running consumers as runnable scenarios (each returns numbers
a test can assert on).

* :func:`long_jobs`: a job longer than ``msg_timeout`` is redelivered and runs
  twice at once, unless kept alive with TOUCH, which works until ``max_msg_timeout``.
* :func:`rolling_restart`: restarting consumers without a drain leaves their
  messages waiting for server timeouts; with a drain they move on at once.
* :func:`starvation` : more nsqd than ``max_in_flight``, messages only on some of them;
  redistribution of RDY finds them.
* :func:`thundering_herd` : many consumers polling one lookupd; jitter spreads the polls.
"""

from __future__ import annotations

import dataclasses
import itertools
from collections import Counter
from dataclasses import dataclass

from ..config import Config
from .handler import Handler
from .simulator import (
    ClusterSpec,
    ConsumerSpec,
    Fault,
    FaultKind,
    Scenario,
    Simulator,
    Workload,
    replay_line,
)

__all__ = [
    "HerdResult",
    "LongJobResult",
    "RestartResult",
    "StarvationResult",
    "long_jobs",
    "rolling_restart",
    "starvation",
    "thundering_herd",
]

_BASE = Config(
    max_in_flight=1,
    default_requeue_delay=1.0,
    max_requeue_delay=10.0,
    backoff_multiplier=0.5,
    max_backoff_duration=4.0,
    lookupd_poll_interval=5.0,
    reconnect_delay=0.5,
    max_reconnect_delay=5.0,
    heartbeat_interval=5.0,
)


def _finish(sim: Simulator, settle: float) -> None:
    sim.heal_all()
    sim.settle(settle)
    sim.monitor.check_final(sim.now, discovery=False)
    sim.raise_if_violated()


def _timeouts(sim: Simulator) -> int:
    total = 0
    for node in sim.nsqds:
        if node.alive:
            for topic in node.nsqd.stats(sim.now, include_clients=False)["topics"]:
                for chan in topic["channels"]:
                    total += chan["timeout_count"]
    return total


@dataclass(frozen=True, slots=True)
class LongJobResult:
    """What :func:`long_jobs` measured for one long message: deliveries, when nsqd handed it
    out again, whether two handlers ran it at once, TOUCHes, give-ups."""

    deliveries: int  # deliveries of the one long message
    redelivered_at: tuple[float, ...]  # when nsqd handed it out again (seconds after the first)
    overlapping: bool  # two handlers ran it at the same time
    touches: int
    given_up: int  # how many consumers gave it up (past max_attempts)
    replay: str


def long_jobs(
    job: float,
    *,
    keepalive: bool,
    msg_timeout: float = 10.0,
    max_msg_timeout: float = 30.0,
    max_attempts: int = 100,
    seed: int = 0,
) -> LongJobResult:
    """One message whose job takes ``job`` seconds, two consumers (max_in_flight 1 each)."""
    base = ClusterSpec()
    cluster = dataclasses.replace(
        base,
        nsqd_options=dataclasses.replace(
            base.nsqd_options, msg_timeout=msg_timeout, max_msg_timeout=max_msg_timeout
        ),
        consumers=(
            ConsumerSpec(
                count=2,
                config=_BASE.replace(max_attempts=max_attempts),
                handler=Handler(duration=job, keepalive=keepalive),
            ),
        ),
    )
    scenario = Scenario(
        cluster=cluster, workload=Workload(messages=1, via_tcp=False, start=2.0), seed=seed
    )
    sim = Simulator(cluster, seed=seed, replay=replay_line(scenario))
    sim.schedule_workload(scenario.workload)
    sim.run_until(2.0 + job * 3 + max_msg_timeout)
    if job < (max_msg_timeout if keepalive else msg_timeout):
        _finish(sim, 300.0)  # it can complete: it must, exactly as the invariants say
    starts = sorted(start for body, _, start, _ in sim.monitor.jobs if body == b"m0")
    spans = sorted((start, end) for body, _, start, end in sim.monitor.jobs if body == b"m0")
    overlapping = any(b[0] < a[1] for a, b in itertools.pairwise(spans))
    touches = sum(c.stats.touches for c in sim.consumers)
    first = starts[0] if starts else 0.0
    return LongJobResult(
        deliveries=sim.monitor.deliveries.get((cluster.topic, "archive", b"m0"), 0),
        redelivered_at=tuple(round(s - first, 3) for s in starts[1:]),
        overlapping=overlapping,
        touches=touches,
        given_up=sum(c.stats.given_up for c in sim.consumers),
        replay=sim.replay,
    )


@dataclass(frozen=True, slots=True)
class RestartResult:
    """What :func:`rolling_restart` measured: messages nsqd had to time out, and the longest
    time from publish to handling."""

    timeouts: int  # messages nsqd had to time out
    max_latency: float  # longest publish -> first successful handling
    finished: int
    expected: int
    replay: str


def rolling_restart(*, drain: bool, consumers: int = 2, seed: int = 0) -> RestartResult:
    """Restart every consumer one after the other (kill, or drain) while messages flow."""
    config = _BASE.replace(max_in_flight=5, drain_timeout=10.0)
    cluster = dataclasses.replace(
        ClusterSpec(),
        consumers=(
            ConsumerSpec(
                count=consumers, config=config, handler=Handler(duration=0.3, concurrency=1)
            ),
        ),
    )
    kind = FaultKind.DRAIN_CONSUMER if drain else FaultKind.KILL_CONSUMER
    faults = tuple(Fault(4.0 + 3.0 * i, kind, f"c0.{i}", 0.5) for i in range(consumers))
    scenario = Scenario(
        cluster=cluster, workload=Workload(messages=100, rate=5.0), faults=faults, seed=seed
    )
    sim = Simulator(cluster, seed=seed, replay=replay_line(scenario))
    sim.schedule_workload(scenario.workload)
    for fault in faults:
        sim.schedule_fault(fault)
    sim.run_until(25.0)
    _finish(sim, 300.0)
    monitor = sim.monitor
    latency = max(
        (monitor.first_handled_at[k] - monitor.accepted_at[k[2]] for k in monitor.first_handled_at),
        default=0.0,
    )
    result = sim.result()
    return RestartResult(
        _timeouts(sim),
        round(latency, 3),
        result.messages_finished,
        result.messages_expected,
        sim.replay,
    )


@dataclass(frozen=True, slots=True)
class StarvationResult:
    """What :func:`starvation` measured: how many messages finished, when the last one did,
    and how many each nsqd delivered."""

    finished: int
    expected: int
    done_at: float  # when the last message was handled (seconds after the first publish)
    per_nsqd: dict[str, int]
    replay: str


def starvation(
    *,
    nsqd: int = 5,
    max_in_flight: int = 2,
    loaded: tuple[int, ...] = (3, 4),
    messages: int = 40,
    seed: int = 0,
) -> StarvationResult:
    """One consumer, more nsqd than max_in_flight, messages only on the ``loaded`` nodes."""
    config = _BASE.replace(
        max_in_flight=max_in_flight, low_rdy_idle_timeout=2.0, rdy_redistribute_interval=1.0
    )
    cluster = dataclasses.replace(
        ClusterSpec(),
        nsqd=nsqd,
        consumers=(ConsumerSpec(count=1, config=config, handler=Handler(duration=0.01)),),
    )
    workload = Workload(messages=messages, rate=20.0, via_tcp=False, start=8.0, targets=loaded)
    scenario = Scenario(cluster=cluster, workload=workload, seed=seed)
    sim = Simulator(cluster, seed=seed, replay=replay_line(scenario))
    sim.schedule_workload(workload)
    sim.run_until(8.0)
    sim.settle(600.0, step=1.0)
    sim.monitor.check_final(sim.now, discovery=False)
    sim.raise_if_violated()
    monitor = sim.monitor
    homes = Counter(monitor.expected[k] for k in monitor.first_handled_at)
    done = max(monitor.first_handled_at.values(), default=8.0) - 8.0
    result = sim.result()
    return StarvationResult(
        result.messages_finished, result.messages_expected, round(done, 3), dict(homes), sim.replay
    )


@dataclass(frozen=True, slots=True)
class HerdResult:
    """What :func:`thundering_herd` measured: lookupd polls, and the most of them in any
    ``window`` seconds (spread polls keep that low)."""

    polls: int
    busiest_window: int  # most lookupd requests within any ``window`` seconds (steady state)
    window: float
    replay: str


def thundering_herd(
    *,
    consumers: int = 40,
    jitter: float = 0.3,
    interval: float = 10.0,
    window: float = 0.5,
    seed: int = 0,
) -> HerdResult:
    """``consumers`` started together poll one lookupd every ``interval`` (+ jitter)."""
    config = _BASE.replace(lookupd_poll_interval=interval, lookupd_poll_jitter=jitter)
    cluster = dataclasses.replace(
        ClusterSpec(),
        consumers=(ConsumerSpec(count=consumers, config=config),),
    )
    scenario = Scenario(cluster=cluster, workload=Workload(messages=0), seed=seed)
    sim = Simulator(cluster, seed=seed, replay=replay_line(scenario))
    sim.run_until(interval * 12)
    times = sorted(t for t, _, _ in sim.monitor.lookup_requests if t > interval * 2)
    busiest = 0
    lo = 0
    for hi, t in enumerate(times):
        while t - times[lo] > window:
            lo += 1
        busiest = max(busiest, hi - lo + 1)
    return HerdResult(len(times), busiest, window, sim.replay)
