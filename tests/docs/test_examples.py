"""The scripts of examples/ run as a reader would run them."""

from __future__ import annotations

import importlib.util
import os
import re
import shutil
import subprocess
import sys

import pytest

from transports.embedded import EmbeddedNSQD
from transports.sync import Producer
from transports.testing.pytest_plugin import nsqd  # noqa: F401

from .codeblocks import ROOT

EXAMPLES = ROOT / "examples"


#: JVM options for a short-lived Spark (the example's own JVM lives for under a minute): the
#: C1 compiler alone and the serial collector start and warm it up with far less CPU than C2
#: and the parallel GC's threads, which would compete with the other tests for the cores.
FAST_START_JAVA_OPTIONS = "-XX:TieredStopAtLevel=1 -XX:+UseSerialGC"


def _run(*args: str, timeout: float, java_options: str = "") -> subprocess.CompletedProcess[str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")]))
    if java_options:  # read by every `java` launched (spark-submit's launcher and the driver)
        env["JDK_JAVA_OPTIONS"] = " ".join(
            filter(None, [env.get("JDK_JAVA_OPTIONS"), java_options])
        )
    return subprocess.run(
        [sys.executable, *args], capture_output=True, text=True, timeout=timeout, env=env
    )


def test_every_example_is_run_here() -> None:
    covered = {
        "roundtrip.py",
        "raw_socket_consumer.py",
        "spark_pipeline.py",
        "spark_stream_aggregate.py",  # imported and run by spark_pipeline.py
        "spark_republish.py",  # imported and run by spark_pipeline.py
    }
    assert {path.name for path in EXAMPLES.glob("*.py")} == covered


@pytest.mark.timeout(60)
def test_roundtrip() -> None:
    result = _run(str(EXAMPLES / "roundtrip.py"), "2000", timeout=50)
    assert result.returncode == 0, result.stdout + result.stderr


@pytest.mark.timeout(60)
def test_raw_socket_consumer(nsqd: EmbeddedNSQD) -> None:  # noqa: F811
    with Producer(nsqd.tcp_address) as producer:
        producer.multi_publish("events", [b"one", b"two", b"three"])
    result = _run(
        str(EXAMPLES / "raw_socket_consumer.py"), nsqd.tcp_address, "events", "c", "3", timeout=50
    )
    assert result.returncode == 0, result.stderr
    assert sorted(result.stdout.split()) == ["one", "three", "two"]


@pytest.mark.spark
@pytest.mark.timeout(600)
def test_spark_pipeline() -> None:
    if importlib.util.find_spec("pyspark") is None or importlib.util.find_spec("pyarrow") is None:
        pytest.skip("needs pyspark and pyarrow (python -m pip install -e '.[spark]')")
    if shutil.which("java") is None and not os.environ.get("JAVA_HOME"):
        pytest.skip("Spark needs a Java runtime (java on PATH or JAVA_HOME)")
    result = _run(
        str(EXAMPLES / "spark_pipeline.py"), timeout=580, java_options=FAST_START_JAVA_OPTIONS
    )
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    # every row the stream wrote was republished to NSQ and read back
    found = re.search(r"^republished (\d+) rows; read back (\d+)", result.stdout, re.MULTILINE)
    assert found is not None, result.stdout
    assert int(found.group(1)) == int(found.group(2)) > 0, result.stdout
