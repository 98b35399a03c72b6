"""Run the code blocks of one Markdown page, in a process of its own (the docs test starts it).

    python tests/docs/page_runner.py docs/getting-started.md RESULTS.json

An embedded nsqlookupd with one nsqd registered with it, and a second nsqd on its own, run on
background threads for the whole page; the blocks' addresses on NSQ's default ports are
substituted with theirs (see ``codeblocks.py``). Python blocks run in order in one namespace,
which starts with:

* ``nsq_cluster``: the running :class:`transports.embedded.Cluster`, as the pytest fixture of
  that name gives it (``nsq_cluster.nsqd``, ``nsq_cluster.lookupd``);
* ``nsqd``: its nsqd (the one at ``127.0.0.1:4150`` in the pages);
* ``tmp_path``: the page's scratch folder (also the working folder);
* ``create_topic(topic, *channels)``: creates the topic (and channels) on that nsqd and waits
  until nsqlookupd lists it (a consumer that asks nsqlookupd before the topic is registered
  asks again only after ``lookupd_poll_interval``);
* ``sigterm_after_finished(topic, channel, count)``: once ``count`` more messages of that
  channel have been finished on the nsqds (nothing left queued or in flight), sends SIGTERM to
  this process, which a documented ``drain_on_signals`` turns into a graceful drain, so a
  consumer loop written to run until stopped ends. If that does not happen within 20 s, the
  block fails (the broker's counts are the referee).

A python block that awaits at top level runs under ``anyio.run`` (asyncio). Each block has
``BLOCK_TIMEOUT`` seconds; a block that does not finish in time fails with a traceback of where
it was. The results (one entry per block: where, what happened) are written as JSON.
"""

from __future__ import annotations

import ast
import contextlib
import inspect
import json
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
import traceback
from pathlib import Path
from types import FrameType
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from codeblocks import (  # noqa: E402
    ROOT,
    Block,
    known_extras,
    parse_page,
    pip_extras,
    substitute,
)

BLOCK_TIMEOUT = float(os.environ.get("NSQ_DOCS_BLOCK_TIMEOUT", "45"))
#: Stop at the first failing block (the docs test sets it for pages it expects to fail).
FAIL_FAST = os.environ.get("NSQ_DOCS_FAIL_FAST") == "1"

_SH_PRELUDE = """\
set -euo pipefail
nsq-sansio() { "$NSQ_DOCS_PYTHON" -m transports.cli "$@"; }
python() { "$NSQ_DOCS_PYTHON" "$@"; }
python3() { "$NSQ_DOCS_PYTHON" "$@"; }
trap 'kill $(jobs -p) 2>/dev/null || true' EXIT
"""


class BlockTimeout(Exception):
    """A block ran longer than BLOCK_TIMEOUT."""


def _alarm(signum: int, frame: FrameType | None) -> None:
    raise BlockTimeout(f"did not finish within {BLOCK_TIMEOUT:g} s")


def _ignore(signum: int, frame: FrameType | None) -> None:
    """SIGTERM outside a documented drain handler: ignored."""


def _free_port() -> int:
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _run_python(block: Block, code: str, namespace: dict[str, Any]) -> None:
    source = "\n" * block.line + code  # tracebacks show the page's own line numbers
    compiled = compile(
        source, str(block.path), "exec", flags=ast.PyCF_ALLOW_TOP_LEVEL_AWAIT, dont_inherit=True
    )
    if compiled.co_flags & inspect.CO_COROUTINE:
        import anyio

        anyio.run(lambda: eval(compiled, namespace))
    else:
        exec(compiled, namespace)


def _run_sh(code: str, cwd: Path, env: dict[str, str]) -> str:
    process = subprocess.Popen(
        ["bash", "-c", _SH_PRELUDE + code],
        cwd=cwd,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )
    try:
        output, _ = process.communicate(timeout=BLOCK_TIMEOUT)
    except subprocess.TimeoutExpired:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGKILL)
        output, _ = process.communicate()
        raise BlockTimeout(
            f"did not finish within {BLOCK_TIMEOUT:g} s; output:\n{output[-3000:]}"
        ) from None
    with contextlib.suppress(ProcessLookupError):
        os.killpg(process.pid, signal.SIGKILL)  # whatever it left running
    if process.returncode != 0:
        raise RuntimeError(f"exit status {process.returncode}; output:\n{output[-3000:]}")
    return output


class _Stopper:
    """``sigterm_after_finished``: watches nsqd's /stats from a thread (see the docstring)."""

    def __init__(self, nsqds: list[Any]) -> None:
        import threading

        self.nsqds = nsqds
        self.failures: list[str] = []
        self.block_done = threading.Event()  # set when the block that asked is over

    def _counts(self, topic: str, channel: str) -> tuple[int, int]:
        """(messages delivered to the channel, messages still queued/in flight/deferred)."""
        import urllib.request

        delivered = waiting = 0
        for server in self.nsqds:
            url = f"http://{server.http_address}/stats?format=json&topic={topic}"
            with urllib.request.urlopen(url, timeout=5) as response:
                stats = json.loads(response.read())
            for topic_stats in stats.get("topics") or []:
                for channel_stats in topic_stats.get("channels") or []:
                    if channel_stats["channel_name"] == channel:
                        delivered += channel_stats["message_count"]
                        waiting += (
                            channel_stats["depth"]
                            + channel_stats["in_flight_count"]
                            + channel_stats["deferred_count"]
                        )
        return delivered, waiting

    def __call__(self, topic: str, channel: str, count: int, timeout: float = 20.0) -> None:
        import threading

        baseline, _ = self._counts(topic, channel)

        done = self.block_done

        def watch() -> None:
            deadline = time.monotonic() + timeout
            while time.monotonic() < deadline:
                if done.is_set():
                    return  # the block ended without needing the signal
                delivered, waiting = self._counts(topic, channel)
                if delivered >= baseline + count and waiting == 0:
                    os.kill(os.getpid(), signal.SIGTERM)
                    return
                time.sleep(0.02)
            self.failures.append(
                f"{count} messages of {topic}/{channel} were not all finished within "
                f"{timeout:g} s (delivered {delivered - baseline}, {waiting} not finished)"
            )
            os.kill(os.getpid(), signal.SIGTERM)

        threading.Thread(target=watch, daemon=True).start()


def run_page(page_path: Path) -> list[dict[str, Any]]:
    """Run every runnable block of the page; one result per block (and per skipped one)."""
    from transports.embedded import Cluster, EmbeddedNSQD, ServerThread

    page = parse_page(page_path)
    results: list[dict[str, Any]] = []
    runnable = page.runnable
    for block in page.blocks:
        if block.language in ("python", "sh") and block.not_run is not None:
            results.append({"where": block.where, "status": "not-run", "reason": block.not_run})
    if not runnable:
        return results
    scratch = Path(tempfile.mkdtemp(prefix="nsq-docs-"))
    for name in ("examples", "bench"):
        (scratch / name).symlink_to(ROOT / name)
    os.chdir(scratch)
    env = dict(os.environ)
    env["NSQ_DOCS_PYTHON"] = sys.executable
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")]))
    env["PATH"] = os.pathsep.join([str(Path(sys.executable).parent), env.get("PATH", "")])
    signal.signal(signal.SIGALRM, _alarm)
    # a SIGTERM that arrives when no drain handler is installed must not end the page's run
    signal.signal(signal.SIGTERM, _ignore)
    extras = known_extras()
    with ServerThread(Cluster(nsqd_count=1)) as cluster, ServerThread(EmbeddedNSQD()) as second:
        assert cluster.lookupd is not None
        first = cluster.nsqd
        addresses = {
            "4150": first.tcp_address,
            "4151": first.http_address,
            "4250": second.tcp_address,
            "4251": second.http_address,
            "4160": cluster.lookupd.tcp_address,
            "4161": cluster.lookupd.http_address,
            "9117": f"127.0.0.1:{_free_port()}",
            "9118": f"127.0.0.1:{_free_port()}",
        }
        stopper = _Stopper([first, second])

        def create_topic(topic: str, *channels: str) -> None:
            import urllib.request

            paths = [f"/topic/create?topic={topic}"]
            paths += [f"/channel/create?topic={topic}&channel={name}" for name in channels]
            for path in paths:
                request = urllib.request.Request(
                    f"http://{first.http_address}{path}", method="POST"
                )
                urllib.request.urlopen(request, timeout=5).close()
            cluster.wait_registered_blocking(topic, producers=1)

        namespace: dict[str, Any] = {
            "__name__": "__docs__",
            "nsq_cluster": cluster,
            "nsqd": first,
            "tmp_path": scratch,
            "create_topic": create_topic,
            "sigterm_after_finished": stopper,
        }
        failed_before = False
        for block in runnable:
            if failed_before and FAIL_FAST:
                results.append({"where": block.where, "status": "not-run", "reason": "fail fast"})
                continue
            started = time.monotonic()
            result: dict[str, Any] = {"where": block.where, "language": block.language}
            print(f"--- {block.where} ({block.language})", flush=True)
            try:
                unknown = sorted(set(pip_extras(block.code)) - extras)
                if unknown:
                    raise ValueError(f"pip install names extras pyproject.toml lacks: {unknown}")
                code = substitute(block.code, block.language, addresses)
                signal.alarm(int(BLOCK_TIMEOUT) + 1)
                try:
                    if block.language == "python":
                        _run_python(block, code, namespace)
                    else:
                        print(_run_sh(code, scratch, env), end="", flush=True)
                finally:
                    signal.alarm(0)
                    if not block.hidden:  # a setup's watcher is for the block after it
                        stopper.block_done.set()
                        stopper.block_done = threading.Event()
                    # asyncio puts SIG_DFL back when a signal receiver closes
                    signal.signal(signal.SIGTERM, _ignore)
                if stopper.failures:
                    raise RuntimeError(stopper.failures.pop())
                result["status"] = "passed"
            except BaseException as exc:  # any failure of a block is reported, SystemExit too
                if isinstance(exc, KeyboardInterrupt):
                    raise
                if type(exc).__name__ == "Skipped":  # pytest.skip() in a block
                    result["status"] = "skipped"
                    result["reason"] = str(exc)
                    results.append(result)
                    continue
                if isinstance(exc, SystemExit) and exc.code in (0, None):
                    result["status"] = "passed"
                    result["seconds"] = round(time.monotonic() - started, 2)
                    results.append(result)
                    continue
                result["status"] = "failed"
                result["after_failure"] = failed_before
                result["error"] = "".join(traceback.format_exception(exc)[-12:])
                failed_before = True
            result["seconds"] = round(time.monotonic() - started, 2)
            results.append(result)
    return results


def main() -> None:
    page, out = Path(sys.argv[1]).resolve(), Path(sys.argv[2])
    results = run_page(page)
    out.write_text(json.dumps(results, indent=1), encoding="utf-8")
    sys.stdout.flush()
    os._exit(0)  # threads a failed block left behind must not keep the process alive


if __name__ == "__main__":
    main()
