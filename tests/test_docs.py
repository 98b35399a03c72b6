"""The documentation: it builds without warnings, its generated page is current, and the code
it ships (the raw-socket consumer of docs/sans-io.md) works against the embedded nsqd."""

from __future__ import annotations

import importlib.util
import json
import os
import re
import subprocess
import sys
import urllib.parse
import urllib.request
from html.parser import HTMLParser
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


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The site, built once for this module with ``mkdocs build --strict``: a broken link, a
    page missing from the nav, a public name without a docstring or any other warning fails
    the build (the test extra installs mkdocs, Material and mkdocstrings)."""
    if (
        importlib.util.find_spec("mkdocs") is None
        or importlib.util.find_spec("mkdocstrings") is None
    ):
        pytest.skip("mkdocs is not installed (python -m pip install -e '.[docs]')")
    site_dir = tmp_path_factory.mktemp("site")
    env = dict(os.environ, NO_MKDOCS_2_WARNING="1")
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")]))
    result = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(site_dir)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=170,
        env=env,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert "WARNING" not in result.stderr, result.stderr
    return site_dir


@pytest.mark.timeout(180)
def test_mkdocs_build_strict(site: Path) -> None:
    assert (site / "index.html").exists()
    assert (site / "configuration" / "index.html").exists()
    for page in (DOCS / "reference").glob("*.md"):
        name = "" if page.stem == "index" else page.stem + "/"
        assert (site / "reference" / name / "index.html").exists(), page


@pytest.mark.timeout(180)
def test_search_index_covers_the_reference(site: Path) -> None:
    """The search box has an index, with an entry for every reference page and the API's
    names (what a reader types: a class, a method)."""
    index = json.loads((site / "search" / "search_index.json").read_text(encoding="utf-8"))
    locations = {entry["location"] for entry in index["docs"]}
    for page in (DOCS / "reference").glob("*.md"):
        name = "" if page.stem == "index" else page.stem + "/"
        assert f"reference/{name}" in locations, page
    for anchor in (
        "reference/anyio/#transports.anyio.Consumer",
        "reference/sync/#transports.sync.Consumer.fetch",
        "reference/connection/#nsq_sansio.connection.ClientConnection",
        "reference/errors/#nsq_sansio.errors.ServerError",
        "reference/consumer/#nsq_sansio.consumer.ConsumerCoordinator",
        "reference/embedded/#transports.embedded.EmbeddedNSQD",
        "reference/cli/#tail",
    ):
        assert anchor in locations, anchor
    titles = " ".join(entry["title"] for entry in index["docs"])
    assert "drain_on_signals" in titles and "max_in_flight" in json.dumps(index)


class _Links(HTMLParser):
    """The ids of one HTML page and the links it makes."""

    def __init__(self) -> None:
        super().__init__()
        self.ids: set[str] = set()
        self.links: list[str] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        found = dict(attrs)
        if found.get("id"):
            self.ids.add(str(found["id"]))
        if tag == "a" and found.get("name"):
            self.ids.add(str(found["name"]))
        target = found.get("href") if tag in ("a", "link") else found.get("src")
        if target and tag in ("a", "link", "img", "script"):
            self.links.append(target)


@pytest.mark.timeout(180)
def test_no_broken_internal_link(site: Path) -> None:
    """Every link from one page of the site to another (or to an anchor) lands somewhere."""
    pages: dict[Path, _Links] = {}
    for html_file in site.rglob("*.html"):
        parser = _Links()
        parser.feed(html_file.read_text(encoding="utf-8"))
        pages[html_file.resolve()] = parser
    broken: list[str] = []
    checked = 0
    for html_file, parser in pages.items():
        for link in parser.links:
            parts = urllib.parse.urlsplit(link)
            if parts.scheme or parts.netloc or link.startswith(("mailto:", "javascript:")):
                continue  # external: not checked (no network in tests)
            path = urllib.parse.unquote(parts.path)
            if not path:
                target = html_file
            elif path.startswith("/"):  # absolute: from the site's root (404.html's links)
                target = (site / path.lstrip("/")).resolve()
            else:
                target = (html_file.parent / path).resolve()
            if target.is_dir():
                target = target / "index.html"
            checked += 1
            if not target.exists():
                broken.append(f"{html_file.relative_to(site)}: {link} (no such file)")
                continue
            if parts.fragment and target.suffix == ".html":
                ids = pages[target].ids if target in pages else set()
                if urllib.parse.unquote(parts.fragment) not in ids:
                    broken.append(f"{html_file.relative_to(site)}: {link} (no such anchor)")
    # README.md is not part of the site, but its links to the docs must land too
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    for link in re.findall(r"\]\((docs/[^)\s]+)\)", readme):
        path, _, fragment = link.partition("#")
        page = Path(path).relative_to("docs").with_suffix("")
        target = site / ("" if page.name == "index" else str(page)) / "index.html"
        checked += 1
        if not target.exists() or (fragment and fragment not in pages[target.resolve()].ids):
            broken.append(f"README.md: {link}")
    assert checked > 1000
    assert not broken, "\n".join(sorted(broken)[:50])


@pytest.mark.timeout(120)
def test_every_public_name_has_a_docstring() -> None:
    """What the build's hook checks, on its own (a quicker failure, naming the names)."""
    pytest.importorskip("griffe")
    api_check = _load(DOCS / "hooks" / "api_check.py", "api_check")
    assert api_check.problems() == []


@pytest.mark.timeout(120)
def test_allowed_missing_docstrings_list_is_not_stale() -> None:
    """Names in the temporary allow-list that have a docstring now (or are gone) are removed
    from it, so the list only shrinks."""
    pytest.importorskip("griffe")
    api_check = _load(DOCS / "hooks" / "api_check.py", "api_check")
    assert api_check.stale_allowances() == []


def test_the_docstring_check_finds_what_is_missing(tmp_path: Path) -> None:
    pytest.importorskip("griffe")
    api_check = _load(DOCS / "hooks" / "api_check.py", "api_check")
    package = tmp_path / "pkg"
    package.mkdir()
    (package / "__init__.py").write_text(
        '"""A package."""\n'
        "from .mod import Base, Child, documented, undocumented\n"
        '__all__ = ["Base", "Child", "documented", "undocumented"]\n'
    )
    (package / "mod.py").write_text(
        '"""A module."""\n'
        "class Base:\n"
        '    """A base."""\n'
        "    def run(self) -> None:\n"
        '        """Run it."""\n'
        "    def stop(self) -> None:\n"
        "        pass\n"
        "    @property\n"
        "    def size(self) -> int:\n"
        "        return 1\n"
        "    def _private(self) -> None:\n"
        "        pass\n"
        "class Child(Base):\n"
        '    """A child."""\n'
        "    def run(self) -> None:  # inherits Base.run's docstring\n"
        "        pass\n"
        "def documented() -> None:\n"
        '    """Documented."""\n'
        "def undocumented() -> None:\n"
        "    pass\n"
        "def not_exported() -> None:\n"
        "    pass\n"
    )
    missing = api_check.missing_docstrings((tmp_path,), ("pkg",))
    assert missing == ["pkg.mod.Base.size", "pkg.mod.Base.stop", "pkg.mod.undocumented"]


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
    for page in DOCS.rglob("*.md"):
        name = page.relative_to(DOCS).as_posix()
        assert f" {name}\n" in nav, f"{name} is not in mkdocs.yml's nav"


@pytest.mark.timeout(10)
def test_page_titles_match_the_nav() -> None:
    """A page's first heading is what its nav entry says (the nav label may be shorter: it is
    the title, or the title starts with it, or the title is its reference page's module)."""
    import yaml

    def entries(nav: list[object]) -> list[tuple[str | None, str]]:
        found: list[tuple[str | None, str]] = []
        for item in nav:
            if isinstance(item, str):
                found.append((None, item))
            elif isinstance(item, dict):
                for label, value in item.items():
                    if isinstance(value, list):
                        found += entries(value)
                    else:
                        found.append((label, value))
        return found

    config = yaml.load((ROOT / "mkdocs.yml").read_text(encoding="utf-8"), Loader=yaml.BaseLoader)
    for label, page in entries(config["nav"]):
        if label is None or page == "index.md":  # the home page's entry says "Home"
            continue
        first = (DOCS / page).read_text(encoding="utf-8").lstrip().split("\n", 1)[0]
        title = first.removeprefix("# ").replace("`", "")
        assert title.lower().startswith(label.lower()), f"{page}: nav {label!r}, title {title!r}"


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
