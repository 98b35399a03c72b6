"""The connection's lifecycle is its transition table: every state change in the code goes
through it, the real connection makes every move it lists, and a move it does not list is
refused with a typed error naming the state and the event."""

from __future__ import annotations

import ast
import inspect
import json
from collections.abc import Iterator
from pathlib import Path

import pytest

import nsq_sansio.connection as connection_module
from nsq_sansio import ClientConnection, ConnectionState
from nsq_sansio._connection_lifecycle import INITIAL_STATE, TRANSITIONS, Lifecycle, next_state
from nsq_sansio.errors import LocalProtocolError

from ._helpers import CLOSE_WAIT, OK, identify_answer, response
from ._servers import ServerStream

Move = tuple[ConnectionState, Lifecycle, ConnectionState]
HANDSHAKES = [
    (tls, compression, auth)
    for tls in (False, True)
    for compression in (None, "snappy", "deflate")
    for auth in (False, True)
]


def _steps(tls: bool, compression: str | None, auth: bool) -> Iterator[ClientConnection]:
    """A connection taken through its whole life with a fake nsqd, one step at a time: the
    handshake (with TLS, compression and AUTH as given), SUB, CLS, CLOSE_WAIT and EOF. Yields
    the connection before each step, so the caller may stop anywhere."""
    identify: dict[str, object] = {"tls_v1": tls}
    if compression:
        identify[compression] = True
    conn = ClientConnection(identify, auth_secret=b"secret" if auth else None)
    server = ServerStream(compression or "none")
    answer = {"tls_v1": tls, "auth_required": auth}
    if compression:
        answer[compression] = True
    yield conn
    conn.receive_data(identify_answer(**answer))
    if tls:
        yield conn
        conn.tls_established()
        yield conn
        conn.receive_data(OK)  # through TLS, before compression starts
        if compression:
            yield conn
            conn.receive_data(server.compress(OK))
    elif compression:
        yield conn
        conn.receive_data(server.compress(OK))
    if auth:
        yield conn
        conn.receive_data(server.compress(response(json.dumps({"identity": "me"}).encode())))
    assert conn.state is ConnectionState.READY
    yield conn
    conn.subscribe("topic", "channel")
    yield conn
    conn.receive_data(server.compress(OK))
    yield conn
    assert conn.close() is None
    yield conn
    conn.receive_data(server.compress(CLOSE_WAIT))
    conn.receive_data(b"")
    assert conn.state is ConnectionState.CLOSED


@pytest.fixture
def moves(monkeypatch: pytest.MonkeyPatch) -> list[Move]:
    """Every move the connection makes while the test runs, as the table applied it."""
    made: list[Move] = []

    def recording(state: ConnectionState, event: Lifecycle) -> ConnectionState:
        after = next_state(state, event)
        made.append((state, event, after))
        return after

    monkeypatch.setattr(connection_module, "next_state", recording)
    return made


def test_the_real_connection_makes_every_move_of_the_table(moves: list[Move]) -> None:
    """Every handshake (TLS or not, snappy, deflate or none, AUTH or not), cut short by EOF at
    each step and taken to its end: the moves made are exactly the table's, and the state the
    connection reports after each is the one the table gave."""
    for handshake in HANDSHAKES:
        stop = 0
        while True:
            first = len(moves)
            steps = _steps(*handshake)
            conn = next(steps)
            for _ in range(stop):
                conn = next(steps, conn)
            if conn.state is ConnectionState.CLOSED:
                break
            if len(moves) > first:
                assert conn.state is moves[-1][2]
            conn.receive_data(b"")  # nsqd goes away in this state
            assert conn.state is ConnectionState.CLOSED
            stop += 1
        for _ in steps:  # the last run: its whole life
            pass
    made = set(moves)
    table = {(state, event, after) for (state, event), after in TRANSITIONS.items()}
    assert made <= table  # next_state raised otherwise
    assert table - made == set(), "moves in the table the connection never makes"
    assert {after for _, _, after in made} | {INITIAL_STATE} == set(ConnectionState)


def test_every_state_is_reachable_in_the_table() -> None:
    reached = {INITIAL_STATE}
    frontier = [INITIAL_STATE]
    while frontier:
        state = frontier.pop()
        for (before, _), after in TRANSITIONS.items():
            if before is state and after not in reached:
                reached.add(after)
                frontier.append(after)
    assert reached == set(ConnectionState)


def test_a_move_not_in_the_table_raises_naming_the_state_and_the_event() -> None:
    refused = [
        (state, event)
        for state in ConnectionState
        for event in Lifecycle
        if (state, event) not in TRANSITIONS
    ]
    assert (ConnectionState.READY, Lifecycle.SUB_OK) in refused
    for state, event in refused:
        with pytest.raises(LocalProtocolError) as raised:
            next_state(state, event)
        assert state.name in str(raised.value) and event.name in str(raised.value)
    conn = ClientConnection()
    with pytest.raises(LocalProtocolError, match=r"SUB_OK.*IDENTIFYING"):
        conn._enter(Lifecycle.SUB_OK)
    assert conn.state is ConnectionState.IDENTIFYING


def _connection_modules() -> set[Path]:
    """The files that make up ClientConnection: its module and those of its parts."""
    files = {Path(inspect.getfile(connection_module))}
    for part in ClientConnection.__mro__:
        if part is not object:
            files.add(Path(inspect.getfile(part)))
    return files


def _state_assignments(tree: ast.AST) -> Iterator[tuple[str, ast.AST, ast.expr | None]]:
    """(enclosing function, assignment, value) for each assignment to an ``_state``
    attribute, however it is written (plain, annotated, augmented, unpacked, setattr)."""

    def targets(node: ast.expr) -> Iterator[ast.expr]:
        if isinstance(node, (ast.Tuple, ast.List)):
            for element in node.elts:
                yield from targets(element)
        elif isinstance(node, ast.Starred):
            yield from targets(node.value)
        else:
            yield node

    def visit(node: ast.AST, function: str) -> Iterator[tuple[str, ast.AST, ast.expr | None]]:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef)):
                inner = child.name
            elif isinstance(child, ast.Lambda):
                inner = "<lambda>"
            else:
                inner = function
            assigned: list[ast.expr] = []
            value: ast.expr | None = None
            if isinstance(child, ast.Assign):
                assigned = [t for target in child.targets for t in targets(target)]
                value = child.value
            elif isinstance(child, (ast.AnnAssign, ast.AugAssign)):
                assigned, value = [child.target], child.value
            elif isinstance(child, (ast.For, ast.AsyncFor, ast.comprehension)):
                assigned = list(targets(child.target))
            elif isinstance(child, ast.NamedExpr):
                assigned = [child.target]
            elif isinstance(child, ast.withitem) and child.optional_vars is not None:
                assigned = list(targets(child.optional_vars))
            elif (
                isinstance(child, ast.Call)
                and isinstance(child.func, ast.Name)
                and child.func.id in {"setattr", "delattr"}
                and len(child.args) >= 2
                and isinstance(child.args[1], ast.Constant)
                and child.args[1].value == "_state"
            ):
                yield function, child, None
            if isinstance(child, ast.Delete):
                assigned = list(child.targets)
            for target in assigned:
                if isinstance(target, ast.Attribute) and target.attr == "_state":
                    yield function, child, value
            yield from visit(child, inner)

    yield from visit(tree, "<module>")


def test_the_state_changes_only_through_the_table() -> None:
    """An AST scan of the connection's modules: ``_state`` is set to the initial state in
    ``__init__`` and otherwise only in ``_enter``, from ``next_state`` (the table)."""
    files = _connection_modules()
    assert len(files) >= 4, files  # the connection and its parts
    seen: list[tuple[str, str]] = []
    for path in files:
        for function, node, value in _state_assignments(ast.parse(path.read_text(), str(path))):
            where = f"{path.name}:{getattr(node, 'lineno', '?')} in {function}()"
            code = ast.unparse(node)
            if function == "__init__":
                assert isinstance(value, ast.Name) and value.id == "INITIAL_STATE", where
            else:
                assert function == "_enter", f"{where} sets the state outside the table: {code}"
                assert (
                    isinstance(value, ast.Call)
                    and isinstance(value.func, ast.Name)
                    and value.func.id == "next_state"
                ), f"{where}: {code}"
            seen.append((path.name, function))
    assert sorted(seen) == [("connection.py", "__init__"), ("connection.py", "_enter")]


def test_the_scan_finds_a_state_set_by_hand() -> None:
    """The scan above is not blind: each way of writing an assignment is found."""
    source = """
class C:
    def a(self):
        self._state = 1
    def b(self, other):
        x, other._state = 1, 2
    def c(self):
        setattr(self, "_state", 3)
    def d(self):
        for self._state in (): pass
    def e(self):
        self._state: int = 4
"""
    found = [function for function, _, _ in _state_assignments(ast.parse(source))]
    assert found == ["a", "b", "c", "d", "e"]
