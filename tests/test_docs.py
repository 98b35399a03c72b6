"""The documentation: it builds without warnings, its generated page is current, and the code
it ships (the raw-socket consumer of docs/sans-io.md) works against the embedded nsqd."""

from __future__ import annotations

import importlib.util
import json
import re
import shutil
import subprocess
import sys
import urllib.request
from pathlib import Path
from types import ModuleType

import pytest

from transports.embedded import EmbeddedNSQD
from transports.sync import Producer
from transports.testing.pytest_plugin import nsqd  # noqa: F401

ROOT = Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs"


def _load(path: Path, name: str) -> ModuleType:
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.timeout(120)
def test_mkdocs_build_strict(tmp_path: Path) -> None:
    """``mkdocs build --strict``: a broken link, a page missing from the nav or any other
    warning fails the build (CI installs mkdocs with the test extra)."""
    if shutil.which("mkdocs") is None and importlib.util.find_spec("mkdocs") is None:
        pytest.skip("mkdocs is not installed (python -m pip install -e '.[test]')")
    result = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(tmp_path / "site")],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=110,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert "WARNING" not in result.stderr, result.stderr
    assert (tmp_path / "site" / "index.html").exists()
    assert (tmp_path / "site" / "configuration" / "index.html").exists()


@pytest.mark.timeout(30)
def test_configuration_page_matches_the_config_object() -> None:
    generator = _load(DOCS / "gen_config_reference.py", "gen_config_reference")
    expected = generator.render()
    committed = (DOCS / "configuration.md").read_text(encoding="utf-8")
    assert committed == expected, (
        "docs/configuration.md is stale: run python docs/gen_config_reference.py --write"
    )
    from nsq_sansio.config import Config

    for field in Config.__dataclass_fields__:
        assert f"| `{field}` |" in committed


@pytest.mark.timeout(10)
def test_every_page_is_in_the_nav() -> None:
    nav = (ROOT / "mkdocs.yml").read_text(encoding="utf-8")
    for page in DOCS.glob("*.md"):
        assert page.name in nav, f"{page.name} is not in mkdocs.yml's nav"


@pytest.mark.timeout(10)
def test_sans_io_page_ships_the_example_verbatim() -> None:
    page = (DOCS / "sans-io.md").read_text(encoding="utf-8")
    blocks = re.findall(r"```python\n(.*?)```", page, flags=re.S)
    example = (ROOT / "examples" / "raw_socket_consumer.py").read_text(encoding="utf-8")
    assert example in blocks
    code_lines = [
        line
        for line in example.split("def consume", 1)[1].split("\n\n\nif __name__")[0].splitlines()
        if line.strip()
    ]
    assert len(code_lines) <= 32  # "drive it yourself in ~30 lines"


@pytest.mark.timeout(30)
def test_raw_socket_consumer_example_against_embedded_nsqd(nsqd: EmbeddedNSQD) -> None:  # noqa: F811
    example = _load(ROOT / "examples" / "raw_socket_consumer.py", "raw_socket_consumer")
    bodies = [f"event {i}".encode() for i in range(25)]
    with Producer(nsqd.tcp_address) as producer:
        producer.multi_publish("events", bodies)
    received = example.consume(nsqd.tcp_address, "events", "archive", 25)
    assert sorted(received) == sorted(bodies)
    with urllib.request.urlopen(
        f"http://{nsqd.http_address}/stats?format=json&topic=events", timeout=5
    ) as response:
        stats = json.loads(response.read())
    (channel,) = stats["topics"][0]["channels"]
    # every message was FIN'd before the CLS: nothing left in flight or queued
    assert channel["depth"] == 0 and channel["in_flight_count"] == 0
    assert channel["requeue_count"] == 0 and channel["timeout_count"] == 0


MY_PAGES = (
    "index.md",
    "getting-started.md",
    "producers.md",
    "discovery.md",
    "security.md",
    "sans-io.md",
    "testing.md",
    "architecture.md",
    "benchmarks.md",
    "migration.md",
    "cli.md",
)


@pytest.mark.timeout(10)
@pytest.mark.parametrize("page", MY_PAGES)
def test_python_snippets_are_valid_python(page: str) -> None:
    import ast

    text = (DOCS / page).read_text(encoding="utf-8")
    for block in re.findall(r"```python\n(.*?)```", text, flags=re.S):
        compile(block, page, "exec", flags=ast.PyCF_ONLY_AST | ast.PyCF_ALLOW_TOP_LEVEL_AWAIT)
