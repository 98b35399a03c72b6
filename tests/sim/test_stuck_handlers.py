"""A handler that never answers a message (a stuck worker) must not stop the consumer: nsqd
takes the message back after msg_timeout and the consumer keeps consuming."""

from __future__ import annotations

import pytest

from nsq_sansio.testing import (
    HANG,
    ClusterSpec,
    ConsumerSpec,
    Handler,
    Scenario,
    Workload,
    run_scenario,
)


def stuck_on_first() -> Handler:
    calls: list[bytes] = []

    def handle(body: bytes) -> object:
        calls.append(body)
        return HANG if len(calls) == 1 else None  # the first job never returns

    return Handler(handle, duration=0.1)


def scenario(*, pull: bool, max_in_flight: int = 1) -> Scenario:
    config = ConsumerSpec().config.replace(max_in_flight=max_in_flight, max_attempts=0)
    consumer = ConsumerSpec(
        count=1, config=config, handler=stuck_on_first(), pull=pull, fetch_batch=1
    )
    return Scenario(
        cluster=ClusterSpec(consumers=(consumer,)),
        workload=Workload(messages=10, rate=50.0, via_tcp=False),
        settle=200.0,
        seed=1,
    )


@pytest.mark.parametrize("max_in_flight", [1, 2])
def test_push_consumer_survives_a_stuck_job(max_in_flight: int) -> None:
    result = run_scenario(scenario(pull=False, max_in_flight=max_in_flight))
    assert result.messages_finished == result.messages_expected == 10
    assert result.monitor.deliveries[("events", "archive", b"m0")] == 2  # taken back once


# Regression: found by the simulator, fixed in a0ed036 (a message past its deadline no longer
# counts against a pull consumer's budget).
def test_pull_consumer_survives_a_stuck_job() -> None:
    result = run_scenario(scenario(pull=True))
    assert result.messages_finished == result.messages_expected == 10
