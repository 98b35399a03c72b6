"""Runs that once broke a promise, kept as named scenarios (each found by a long search; the
replay line it printed is the scenario below, written out so it survives format changes)."""

from __future__ import annotations

import dataclasses

import pytest

from nsq_sansio.config import Config
from nsq_sansio.testing import (
    ClusterSpec,
    ConsumerSpec,
    Handler,
    LinkSpec,
    Scenario,
    Workload,
    run_scenario,
)


def quick(**changes: object) -> Config:
    """A consumer configuration with the short timers the generated scenarios use."""
    fields: dict[str, object] = {
        "max_attempts": 0,
        "default_requeue_delay": 0.5,
        "max_requeue_delay": 10.0,
        "backoff_multiplier": 0.1,
        "max_backoff_duration": 1.0,
        "lookupd_poll_interval": 1.0,
        "lookupd_poll_jitter": 0.0,
        "reconnect_delay": 0.1,
        "max_reconnect_delay": 5.0,
        "low_rdy_idle_timeout": 3.0,
        "rdy_redistribute_interval": 0.5,
        "drain_timeout": 2.0,
        "heartbeat_interval": 5.0,
    }
    fields.update(changes)
    return Config(**fields)  # type: ignore[arg-type]


def accounted(scenario: Scenario) -> None:
    result = run_scenario(scenario)  # raises InvariantViolation (with a replay line)
    done = result.messages_finished + len(result.monitor.excused - result.monitor.finished)
    assert done == result.messages_expected


# --- pull mode: the RDY must reach the nsqd that has the messages ------------------------------

#: Two nsqd, pull consumers with max_in_flight 1 (fewer RDY than connections) on a jittery link:
#: the RDY holder runs dry and passes its RDY on; the other connection is given the share but
#: must wait for the lowered RDY to settle, and the periodic redistribution took that share away
#: again as "idle" (it never had RDY to receive with), handing it back to the dry holder, for
#: good: 9 messages stayed on nsqd1 (no fault involved).
PULL_SHARE_BOUNCES = Scenario(
    cluster=ClusterSpec(
        nsqd=2,
        durable=False,
        consumers=(
            ConsumerSpec(
                count=2,
                channel="audit",
                config=quick(backoff_enabled=False, backoff_multiplier=0.5),
                handler=Handler(duration=0.5, jitter=0.01, keepalive=True, concurrency=1),
                pull=True,
            ),
            ConsumerSpec(
                count=2,
                config=quick(
                    max_in_flight=3,
                    max_attempts=3,
                    reconnect_delay=1.0,
                    rdy_redistribute_interval=2.0,
                    drain_timeout=10.0,
                ),
                handler=Handler(duration=2.0, jitter=0.2, backoff=False, concurrency=4),
                pull=True,
            ),
        ),
        link=LinkSpec(latency=0.0001, jitter=0.05, segment=5),
    ),
    workload=Workload(messages=19, batch=5, start=2.0, via_tcp=False),
    seed=22206,
)


def test_a_pull_share_waiting_for_budget_is_not_taken_away_as_idle() -> None:
    accounted(PULL_SHARE_BOUNCES)


@pytest.mark.parametrize("seed", [22206, 1, 2, 3])
def test_one_pull_consumer_over_two_nsqd_reaches_both(seed: int) -> None:
    one = dataclasses.replace(PULL_SHARE_BOUNCES.cluster.consumers[0], count=1)
    cluster = dataclasses.replace(PULL_SHARE_BOUNCES.cluster, consumers=(one,))
    accounted(dataclasses.replace(PULL_SHARE_BOUNCES, cluster=cluster, seed=seed))
