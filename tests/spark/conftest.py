"""One local SparkSession for the whole test session, and embedded brokers for the Spark tests.

Everything here skips cleanly when pyspark, pyarrow or a JVM is missing. The data source lives
in the installed package (``transports.spark``): classes defined in a test module could not be
unpickled by Spark's Python workers.
"""

from __future__ import annotations

import os
import shutil
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

_LOG4J2 = """\
status = error
rootLogger.level = error
rootLogger.appenderRef.stderr.ref = console
appender.console.type = Console
appender.console.name = console
appender.console.target = SYSTEM_ERR
appender.console.layout.type = PatternLayout
appender.console.layout.pattern = %d{HH:mm:ss} %p %c{1}: %m%n
logger.python.name = org.apache.spark.api.python
logger.python.level = error
"""


def _java_available() -> bool:
    java_home = os.environ.get("JAVA_HOME")
    if java_home and Path(java_home, "bin", "java").exists():
        return True
    return shutil.which("java") is not None


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Every test here is marked ``spark``; those that use the session's JVM (the ``spark``
    fixture) form one ``xdist_group``, so a parallel run (``-n auto --dist loadgroup``) starts
    one JVM on one worker instead of one per worker (tryfirst: before xdist reads the groups)."""
    here = Path(__file__).parent
    for item in items:
        if here in Path(str(item.fspath)).parents:
            item.add_marker(pytest.mark.spark)
            if "spark" in getattr(item, "fixturenames", ()):
                item.add_marker(pytest.mark.xdist_group("spark-session"))


@pytest.fixture(scope="session")
def spark() -> Iterator[Any]:
    """A local[2] SparkSession with the "nsq" format registered; stopped at the end."""
    pytest.importorskip("pyspark")
    pytest.importorskip("pyarrow")
    if not _java_available():
        pytest.skip("Spark tests need a Java runtime (java on PATH or JAVA_HOME)")
    from pyspark.sql import SparkSession

    from transports.spark import register

    os.environ["PYSPARK_PYTHON"] = sys.executable
    os.environ["PYSPARK_DRIVER_PYTHON"] = sys.executable
    workdir = Path(tempfile.mkdtemp(prefix="nsq-spark-"))
    log_config = workdir / "log4j2.properties"
    log_config.write_text(_LOG4J2)
    java_options = f"-Dlog4j2.configurationFile=file:{log_config}"
    session = (
        SparkSession.builder.master("local[2]")
        .appName("nsq-sansio-tests")
        .config("spark.sql.shuffle.partitions", "2")
        .config("spark.default.parallelism", "2")
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.driver.extraJavaOptions", java_options)
        .config("spark.executor.extraJavaOptions", java_options)
        .config("spark.sql.streaming.stopTimeout", "30s")
        .config("spark.local.dir", str(workdir / "local"))
        .config("spark.sql.warehouse.dir", str(workdir / "warehouse"))
        .getOrCreate()
    )
    session.sparkContext.setLogLevel("ERROR")
    register(session)
    try:
        yield session
    finally:
        session.stop()
        shutil.rmtree(workdir, ignore_errors=True)


@pytest.fixture(scope="session")
def nsqd_pair() -> Iterator[list[Any]]:
    """Two embedded nsqd (real loopback sockets) shared by the Spark tests."""
    from transports.embedded.nsqd import EmbeddedNSQD
    from transports.embedded.thread import ServerThread

    threads = [ServerThread(EmbeddedNSQD()) for _ in range(2)]
    servers = [t.start() for t in threads]
    try:
        yield servers
    finally:
        for thread in threads:
            thread.stop()
