"""Property-based runs of whole clusters under faults: every invariant after every step and at
the end. CI runs a bounded, derandomized set; ``NSQ_SIM_PROFILE=nightly`` runs many more.
A failure prints ``replay: python -m nsq_sansio.testing replay <blob>``."""

from __future__ import annotations

from hypothesis import given, note

from nsq_sansio.testing import Scenario, replay_line, run_scenario
from nsq_sansio.testing.strategies import scenarios

from ._profile import SIM


@SIM
@given(scenarios(max_nsqd=4, max_messages=150, max_faults=4, hangs=True))
def test_cluster_keeps_its_promises_under_faults(scenario: Scenario) -> None:
    note(replay_line(scenario))
    result = run_scenario(scenario)
    accounted = result.messages_finished + len(
        result.monitor.excused - result.monitor.finished - result.monitor.given_up
    )
    assert accounted == result.messages_expected


@SIM
@given(scenarios(max_nsqd=3, max_messages=100, max_faults=0))
def test_without_faults_nothing_is_lost_or_excused(scenario: Scenario) -> None:
    note(replay_line(scenario))
    result = run_scenario(scenario)
    assert not result.monitor.excused
    assert result.messages_finished == result.messages_expected
