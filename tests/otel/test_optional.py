"""OpenTelemetry is optional: without it installed the library imports and runs (consume and
publish, every runtime), the envelope helpers still work, and ``transports.otel``'s calls say
which extra to install; with it installed, a client nobody instrumented is untouched."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

from transports.embedded import EmbeddedNSQD

ROOT = Path(__file__).resolve().parents[2]

#: Makes ``import opentelemetry`` (and every submodule) fail in the child, as if it were not
#: installed: a sitecustomize, imported by the interpreter at start-up.
BLOCKER = """
import importlib.abc
import sys


class _NoOpenTelemetry(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name == "opentelemetry" or name.startswith("opentelemetry."):
            raise ModuleNotFoundError(f"No module named {name!r}", name=name)
        return None


sys.meta_path.insert(0, _NoOpenTelemetry())
"""

CHILD = """
import sys

import anyio

try:
    import opentelemetry  # noqa: F401
except ModuleNotFoundError:
    pass
else:
    raise SystemExit("the blocker did not block opentelemetry")

import transports.anyio
import transports.sync
import transports.trio

address = sys.argv[1]

with transports.sync.Producer(address) as producer:
    producer.multi_publish("plain", [b"a", b"b"])
with transports.sync.Consumer("plain", "blocking", nsqd=address) as consumer:
    bodies = []
    for msg in consumer:
        bodies.append(msg.body)
        msg.finish()
        if len(bodies) == 2:
            break
assert bodies == [b"a", b"b"], bodies


async def main():
    async with transports.anyio.Producer(address) as producer:
        await producer.multi_publish("async", [b"c", b"d"])
    async with transports.anyio.Consumer("async", "async", nsqd=address) as consumer:
        got = []
        async for msg in consumer:
            got.append(msg.body)
            await msg.finish()
            if len(got) == 2:
                break
    assert got == [b"c", b"d"], got


anyio.run(main)

from transports.otel import MARKER, unwrap, wrap  # the envelope needs nothing else

assert unwrap(wrap(b"body", {"traceparent": "x"})) == ({"traceparent": "x"}, b"body")
try:
    from transports.otel import instrument  # noqa: F401
except ImportError as exc:
    assert "nsq-sansio[otel]" in str(exc), exc
else:
    raise SystemExit("instrument imported without opentelemetry")
assert not [m for m in sys.modules if m.split(".")[0] == "opentelemetry"]
print("ok")
"""


def test_the_library_runs_without_opentelemetry(nsqd: EmbeddedNSQD, tmp_path: Path) -> None:
    (tmp_path / "sitecustomize.py").write_text(BLOCKER, encoding="utf-8")
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(tmp_path), str(ROOT), env.get("PYTHONPATH", "")])
    result = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(CHILD), nsqd.tcp_address],
        capture_output=True,
        text=True,
        env=env,
        timeout=90,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert result.stdout.strip().endswith("ok")


def test_a_client_nobody_instrumented_runs_its_own_code() -> None:
    """No hook and no wrapper: the consumers' hook attribute is None and every method is the
    class's (after instrument() and uninstrument() too)."""
    import transports.anyio
    import transports.sync
    from transports import otel

    anyio_consumer = transports.anyio.Consumer("t", "c", nsqd="127.0.0.1:4150")
    sync_consumer = transports.sync.Consumer("t", "c", nsqd="127.0.0.1:4150")
    producers = [transports.anyio.Producer("127.0.0.1:4150"), transports.sync.Producer()]
    for client in (anyio_consumer, sync_consumer, *producers):
        before = dict(vars(client))
        otel.instrument(client, propagate=True)
        assert set(vars(client)) > set(before)  # the wrappers are on the instance
        otel.uninstrument(client)
        assert vars(client).keys() == before.keys()
    assert anyio_consumer._telemetry is None
    assert sync_consumer._io.telemetry is None
