"""The consumer's lifecycle is a transition table: every state change in the package goes
through :meth:`Lifecycle.apply`, each transition of the table is one the coordinator makes,
and an event the table does not list raises a typed error naming the state and the event."""

from __future__ import annotations

import ast
import itertools
import random
from pathlib import Path

import pytest

from nsq_sansio.config import Config
from nsq_sansio.consumer import ConsumerCoordinator, ConsumerState
from nsq_sansio.consumer.lifecycle import (
    TRANSITIONS,
    Lifecycle,
    LifecycleError,
    LifecycleEvent,
)
from nsq_sansio.errors import LocalProtocolError

from .harness import World

PACKAGE = Path(__file__).resolve().parents[2] / "nsq_sansio" / "consumer"


def _state_writes(directory: Path = PACKAGE) -> set[tuple[str, str]]:
    """(module, enclosing function) of every assignment to a ``state``/``_state`` attribute
    in the modules of ``directory`` (the consumer package)."""
    found: set[tuple[str, str]] = set()
    for path in sorted(directory.glob("*.py")):
        tree = ast.parse(path.read_text(encoding="utf-8"))

        def visit(node: ast.AST, scope: str, module: str = path.name) -> None:
            for child in ast.iter_child_nodes(node):
                inner = scope
                if isinstance(child, ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef):
                    inner = f"{scope}.{child.name}" if scope else child.name
                targets: list[ast.expr] = []
                if isinstance(child, ast.Assign):
                    targets = list(child.targets)
                elif isinstance(child, ast.AugAssign | ast.AnnAssign):
                    targets = [child.target]
                for target in targets:
                    for each in ast.walk(target):
                        if isinstance(each, ast.Attribute) and each.attr in ("state", "_state"):
                            found.add((module, scope))
                visit(child, inner)

        visit(tree, "")
    return found


def test_only_the_table_changes_the_consumer_state() -> None:
    assert _state_writes() == {
        ("lifecycle.py", "Lifecycle.__init__"),  # CREATED, the start of the table
        ("lifecycle.py", "Lifecycle.apply"),
        ("lifecycle.py", "LifecycleError.__init__"),  # the state the error names, not a change
    }


def test_the_scan_sees_a_state_written_outside_the_table(tmp_path: Path) -> None:
    # The scan itself: assignments like the ones the table replaced are found, with where.
    (tmp_path / "drain.py").write_text(
        "class Drain:\n"
        "    def drain(self):\n"
        "        self._state = 'draining'\n"
        "    def fail(self):\n"
        "        self.core.state, x = 'failed', 1\n",
        encoding="utf-8",
    )
    assert _state_writes(tmp_path) == {("drain.py", "Drain.drain"), ("drain.py", "Drain.fail")}


@pytest.mark.parametrize(("state", "event"), list(itertools.product(ConsumerState, LifecycleEvent)))
def test_the_table_is_the_only_way_from_each_state(
    state: ConsumerState, event: LifecycleEvent
) -> None:
    lifecycle = Lifecycle()
    lifecycle.state = state  # set up the walk (the coordinator never does this)
    if (state, event) in TRANSITIONS:
        assert lifecycle.apply(event) is TRANSITIONS[state, event]
        assert lifecycle.state is TRANSITIONS[state, event]
        return
    with pytest.raises(LifecycleError) as info:
        lifecycle.apply(event)
    assert isinstance(info.value, LocalProtocolError)
    assert info.value.state is state and info.value.event is event
    assert state.name in str(info.value) and event.name in str(info.value)
    assert lifecycle.state is state  # nothing changed


def test_closed_and_failed_are_final() -> None:
    finals = {ConsumerState.CLOSED, ConsumerState.FAILED}
    assert not [key for key in TRANSITIONS if key[0] in finals]
    assert finals <= set(TRANSITIONS.values())


def test_the_coordinator_makes_every_transition_of_the_table(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    made: list[tuple[ConsumerState, LifecycleEvent]] = []
    apply = Lifecycle.apply

    def recorded(self: Lifecycle, event: LifecycleEvent) -> ConsumerState:
        made.append((self.state, event))
        return apply(self, event)

    monkeypatch.setattr(Lifecycle, "apply", recorded)

    # CREATED -> CLOSED: a drain before start.
    unstarted = ConsumerCoordinator("t", "c", rng=random.Random(1), nsqd=["127.0.0.1:4150"])
    unstarted.drain(0.0)
    assert unstarted.state is ConsumerState.CLOSED

    # CREATED -> RUNNING -> DRAINING -> CLOSED.
    w = World(1, Config(max_in_flight=4))
    w.start()
    assert w.coordinator.state is ConsumerState.RUNNING
    with pytest.raises(LocalProtocolError):
        w.coordinator.start(w.now)  # once only
    w.coordinator.drain(w.now, 1.0)
    for _ in range(100):
        if w.coordinator.state is ConsumerState.CLOSED:
            break
        w.advance(0.1)
    assert w.coordinator.state is ConsumerState.CLOSED

    # RUNNING -> FAILED: nsqd refuses the configuration.
    failing = World(1, Config(output_buffer_timeout=0.01))
    failing.start()
    assert failing.coordinator.state is ConsumerState.FAILED

    assert set(made) == set(TRANSITIONS)
