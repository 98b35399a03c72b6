"""Hypothesis's profile for the whole suite.

The default (``ci``) is deterministic: the same examples on every run and machine, no example
database and no per-example deadline (a loaded CI machine is slow, not wrong), so a red run is
a bug in the code, not the luck of the draw. The long searches draw at random on purpose:
``HYPOTHESIS_PROFILE=dev`` for the whole suite, or the simulator's and the fuzz targets' own
settings (``NSQ_SIM_PROFILE=nightly``, ``NSQ_FUZZ_EXAMPLES``), see docs/testing.md.
"""

from __future__ import annotations

import os

import pytest
from hypothesis import HealthCheck, settings

settings.register_profile(
    "ci",
    derandomize=True,
    database=None,
    deadline=None,
    print_blob=True,
    suppress_health_check=[HealthCheck.too_slow],
)
settings.register_profile("dev", deadline=None, print_blob=True)


def _profile() -> str:
    """``dev`` (random) when asked, or when a long search is asked for by its own variable."""
    if os.environ.get("HYPOTHESIS_PROFILE"):
        return os.environ["HYPOTHESIS_PROFILE"]
    long_search = os.environ.get("NSQ_SIM_PROFILE", "").strip().lower() == "nightly" or bool(
        os.environ.get("NSQ_FUZZ_EXAMPLES") or os.environ.get("NSQ_SIM_EXAMPLES")
    )
    return "dev" if long_search else "ci"


settings.load_profile(_profile())


def pytest_xdist_auto_num_workers(config: pytest.Config) -> int | None:
    """``-n auto`` (the README's test command): three workers per usable core. Most tests wait
    (on loopback sockets, on a broker's timers, on child processes) rather than compute: on 2
    cores the whole suite took 287 s on 4 workers and 227 s on 6. ``PYTEST_XDIST_AUTO_NUM_WORKERS``
    still decides when it is set."""
    if os.environ.get("PYTEST_XDIST_AUTO_NUM_WORKERS"):
        return None  # xdist's own hook reads it
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    return 3 * (cores or 1)


# A parallel run (``-n auto --dist loadgroup``, see docs/testing.md) hands tests to whichever
# worker is free, groups first (the largest first), then one test at a time in collection order.
#: Fixtures too costly to build on every worker (mkdocs builds the whole site): the tests using
#: one form one group, so one worker builds it once. (The Spark session: tests/spark/conftest.py.)
_ONE_WORKER_FIXTURES = {"site": "mkdocs-site"}
#: The longest single tests (tens of seconds each on 2 cores: a JVM in a child process, mypy
#: over the whole tree, hypothesis searches over simulated clusters, every CLI page's code
#: blocks): started first, so that none of them is the last thing running.
_LONGEST_FIRST = (
    "tests/docs/test_examples.py::test_spark_pipeline",
    "tests/test_quality.py::test_core_and_transports_are_mypy_strict_clean",
    "tests/sim/test_properties.py::",
    "tests/sim/test_user_handler.py::",
    "tests/docs/test_code_blocks.py::test_code_blocks_run",
    "tests/clients/test_hostile_nsqd.py::test_reading_pauses",
)


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Group the tests of the costly shared fixtures; on a worker, the longest tests first
    (every worker sorts its identical collection the same way; a serial run keeps its order)."""
    for item in items:
        for fixture, group in _ONE_WORKER_FIXTURES.items():
            if fixture in getattr(item, "fixturenames", ()):
                item.add_marker(pytest.mark.xdist_group(group))
    if os.environ.get("PYTEST_XDIST_WORKER"):
        items.sort(key=lambda item: not item.nodeid.startswith(_LONGEST_FIRST))
