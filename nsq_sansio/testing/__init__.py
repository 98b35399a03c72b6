"""Deterministic simulation of whole NSQ clusters (no IO): the core's nsqd, nsqlookupd,
consumer and producer state machines on a virtual clock and a simulated network with faults.

Quick start::

    from nsq_sansio.testing import Scenario, ClusterSpec, ConsumerSpec, Handler, run_scenario

    result = run_scenario(Scenario(cluster=ClusterSpec(nsqd=3), seed=7))
    assert result.messages_finished == result.messages_expected

The modules, from the bottom up: ``clock`` (virtual time), ``network`` (connections and
faults), ``specs`` (what a run is made of), ``handler`` (the simulated user handler),
``violations`` (the rules), ``nodes/`` (one module per node kind, with ``base`` holding what a
node is and sees), ``invariants`` (the monitor that checks the rules), ``simulator`` (builds and
runs a cluster); ``wire`` parses what the monitor reads off connections.

Hypothesis strategies live in :mod:`nsq_sansio.testing.strategies` (needs ``hypothesis``);
ready-made field scenarios in :mod:`nsq_sansio.testing.scenarios`.
"""

from .clock import Scheduler
from .handler import HANG, Handler
from .invariants import Monitor
from .network import LinkSpec, Network, SimConn
from .nodes import ConsumerNode, LookupdNode, NsqdNode, ProducerNode, SimDisk, SimNode
from .simulator import (
    RunResult,
    Simulator,
    replay_line,
    run_scenario,
    scenario_blob,
    scenario_from_blob,
)
from .specs import ClusterSpec, ConsumerSpec, Fault, FaultKind, Scenario, Workload
from .violations import Invariant, InvariantViolation, Violation

__all__ = [
    "HANG",
    "ClusterSpec",
    "ConsumerNode",
    "ConsumerSpec",
    "Fault",
    "FaultKind",
    "Handler",
    "Invariant",
    "InvariantViolation",
    "LinkSpec",
    "LookupdNode",
    "Monitor",
    "Network",
    "NsqdNode",
    "ProducerNode",
    "RunResult",
    "Scenario",
    "Scheduler",
    "SimConn",
    "SimDisk",
    "SimNode",
    "Simulator",
    "Violation",
    "Workload",
    "replay_line",
    "run_scenario",
    "scenario_blob",
    "scenario_from_blob",
]
