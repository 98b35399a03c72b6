"""The examples of docs/simulator.md: testing your own handler in a simulated cluster."""

from __future__ import annotations

from hypothesis import given, settings

from nsq_sansio.testing import (
    ClusterSpec,
    ConsumerSpec,
    Fault,
    FaultKind,
    Handler,
    Scenario,
    Workload,
    run_scenario,
)
from nsq_sansio.testing.strategies import scenarios

from ._profile import SIM


class Orders:
    """The user's code under test: applies each order once, even when NSQ redelivers it."""

    def __init__(self, *, poison: bool = True) -> None:
        self.applied: dict[bytes, int] = {}
        self.calls = 0
        self.poison = poison

    def handle(self, body: bytes) -> None:
        self.calls += 1
        if self.poison and body.endswith(b"13"):
            raise ValueError("poison message")  # always fails: must end up given up
        if body in self.applied:
            return  # a redelivery: already applied, do nothing
        self.applied[body] = 1


def test_my_handler_applies_every_order_once_despite_faults() -> None:
    orders = Orders()
    handler = Handler(orders.handle, duration=0.05, jitter=0.05, failure_rate=0.05)
    scenario = Scenario(
        cluster=ClusterSpec(nsqd=2, consumers=(ConsumerSpec(count=3, handler=handler),)),
        workload=Workload(messages=300, rate=100.0),
        faults=(
            Fault(2.0, FaultKind.KILL_CONSUMER, "c0.1", 1.0),
            Fault(2.5, FaultKind.PARTITION, "nsqd1", 12.0),
        ),
        seed=42,
    )
    result = run_scenario(scenario)  # raises InvariantViolation if NSQ's promises break
    poison = {b"m%d" % i for i in range(300) if str(i).endswith("13")}
    assert set(orders.applied) == {b"m%d" % i for i in range(300)} - poison
    assert {key[2] for key in result.monitor.given_up} == poison
    assert orders.calls > len(orders.applied)  # it did see redeliveries and failures


@SIM
@given(scenarios(max_messages=60, max_faults=3))
def test_my_handler_under_generated_clusters(scenario: Scenario) -> None:
    # no poison here: generated consumers may retry forever (max_attempts=0)
    orders = Orders(poison=False)
    result = run_scenario(scenario.with_handler(Handler(orders.handle, duration=0.01)))
    expected = {key[2] for key in result.monitor.expected}
    lost = {key[2] for key in result.monitor.excused}  # crashed brokers without durability
    assert expected - lost <= set(orders.applied)


@settings(max_examples=1, deadline=None)
@given(scenarios(max_messages=10, max_faults=0))
def test_with_handler_replaces_every_handler(scenario: Scenario) -> None:
    handler = Handler(duration=0.123)
    changed = scenario.with_handler(handler)
    assert all(c.handler is handler for c in changed.cluster.consumers)
    assert changed.workload == scenario.workload and changed.seed == scenario.seed
