"""The core does no IO and reads no clock: checked statically and in a fresh interpreter."""

from __future__ import annotations

import ast
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import nsq_sansio

PACKAGE = Path(nsq_sansio.__file__).parent
IO_MODULES = {
    "socket",
    "ssl",
    "select",
    "selectors",
    "asyncio",
    "anyio",
    "trio",
    "threading",
    "subprocess",
    "signal",
    "multiprocessing",
    "concurrent",
    "urllib.request",
    "http.client",
    "requests",
    "httpx",
    "mmap",
}
CLOCK_MODULES = {"time", "datetime"}


def _forbidden(modules: set[str], forbidden: set[str]) -> set[str]:
    """Names in ``modules`` that are a forbidden module or inside one."""
    return {m for m in modules if any(m == f or m.startswith(f + ".") for f in forbidden)}


def _imported(path: Path) -> set[str]:
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names.add(node.module)
            names.update(f"{node.module}.{alias.name}" for alias in node.names)
        elif isinstance(node, ast.Call) and getattr(node.func, "id", None) == "__import__":
            names.add("__import__")
    return names


def test_no_core_module_imports_io_or_clock_modules() -> None:
    offenders = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        bad = _forbidden(_imported(path), IO_MODULES | CLOCK_MODULES | {"__import__", "importlib"})
        if bad:
            offenders[str(path.relative_to(PACKAGE))] = sorted(bad)
    assert offenders == {}


def test_randomness_only_comes_from_injected_random_instances() -> None:
    """Replayable runs: no module-level ``random.*()`` draw, no OS entropy, no uuid/secrets."""
    offenders = []
    for path in sorted(PACKAGE.rglob("*.py")):
        tree = ast.parse(path.read_text(), str(path))
        for node in ast.walk(tree):
            if isinstance(node, (ast.Import, ast.ImportFrom)):
                names = [a.name for a in node.names]
                module = getattr(node, "module", None) or ""
                if {"secrets", "uuid"} & {module, *names}:
                    offenders.append(f"{path.name}:{node.lineno} imports secrets/uuid")
                if module == "random" and set(names) - {"Random"}:
                    offenders.append(f"{path.name}:{node.lineno} from random import {names}")
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
                owner = node.func.value
                if isinstance(owner, ast.Name) and (
                    (owner.id == "random" and node.func.attr != "Random")
                    or (owner.id == "os" and node.func.attr in {"urandom", "getrandom"})
                ):
                    offenders.append(f"{path.name}:{node.lineno} {owner.id}.{node.func.attr}()")
    assert offenders == []


# Run in a fresh interpreter without site (so nothing preloads threading), with the clock
# functions replaced by tripwires *before* the core is imported (catches `from time import ...`).
_PROBE = r"""
import sys, json
sys.path[:0] = json.loads(sys.argv[1])
import time
calls = []
def tripwire(name):
    def read(*args, **kwargs):
        calls.append(name)
        return 0
    return read
for name in ("time", "time_ns", "monotonic", "monotonic_ns", "perf_counter",
             "perf_counter_ns", "process_time", "sleep", "localtime", "gmtime"):
    setattr(time, name, tripwire(name))
preload, skip = json.loads(sys.argv[2]), set(json.loads(sys.argv[3]))
for name in preload:  # a declared test-only dependency, not the core's doing
    __import__(name)
calls.clear()  # what the test-only library read while importing is not the core's
before = set(sys.modules)
import importlib, pkgutil, nsq_sansio
for info in pkgutil.walk_packages(nsq_sansio.__path__, "nsq_sansio."):
    if info.name not in skip:
        importlib.import_module(info.name)

# exercise the core: handshake with deflate, subscribe, messages, heartbeat, timers, CLS
import zlib
from nsq_sansio import ClientConnection
from nsq_sansio.frames import encode_frame, encode_message_frame
z = zlib.compressobj(6, zlib.DEFLATED, -15)
comp = lambda b: z.compress(b) + z.flush(zlib.Z_SYNC_FLUSH)
conn = ClientConnection({"deflate": True, "heartbeat_interval": 1000})
conn.receive_data(encode_frame(0, b'{"deflate": true}') + comp(encode_frame(0, b"OK")), now=1.0)
conn.subscribe("t", "c")
conn.receive_data(comp(encode_frame(0, b"OK")))
conn.send_ready(5)
events = conn.receive_data(comp(encode_message_frame(b"0123456789abcdef", 1, 1, b"x")
                                + encode_frame(0, b"_heartbeat_")), now=2.0)
conn.finish(events[0].id)
conn.next_deadline(); conn.handle_timer(3.0)
conn.close(); conn.data_to_send()
conn.receive_data(comp(encode_frame(0, b"CLOSE_WAIT"))); conn.receive_data(b"")
print(json.dumps({"new": sorted(set(sys.modules) - before), "clock_calls": calls,
                  "state": conn.state.name}))
"""


#: nsq_sansio modules that exist to help users' tests and may import a test-only library (which
#: itself loads asyncio, threading...). They are checked with that library preloaded, so only
#: what they add themselves counts; the AST check above still covers their own imports.
TEST_HELPERS = {"nsq_sansio.testing.strategies": "hypothesis"}


def _probe(preload: list[str], skip: list[str]) -> dict[str, Any]:
    paths = [str(PACKAGE.parent), *[p for p in sys.path if p]]
    result = subprocess.run(
        [sys.executable, "-S", "-c", _PROBE, *map(json.dumps, (paths, preload, skip))],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    report: dict[str, Any] = json.loads(result.stdout.strip().splitlines()[-1])
    return report


def test_fresh_interpreter_imports_no_io_module_and_reads_no_clock() -> None:
    report = _probe([], sorted(TEST_HELPERS))
    assert _forbidden(set(report["new"]), IO_MODULES) == set()
    assert report["clock_calls"] == []
    assert report["state"] == "CLOSED"


def test_test_helper_modules_add_no_io_module_of_their_own() -> None:
    report = _probe(sorted(set(TEST_HELPERS.values())), [])
    assert _forbidden(set(report["new"]), IO_MODULES) == set()
    assert report["clock_calls"] == []
