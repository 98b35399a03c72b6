"""The code blocks of README.md and docs/*.md, as the docs test runs them.

A page's fenced ``python`` blocks run in order in one namespace (like a reader pasting them
into one interpreter), its ``sh``/``bash`` blocks with bash; ``console``, ``text`` and blocks
without a language are illustrations and are not run. What a page can say in HTML comments
(invisible on the rendered page):

* ``<!-- not-run: why -->`` on the line(s) just before a block: the block is not run, for the
  reason given (a real cluster, a JVM, the test suite itself...).
* ``<!-- setup:`` then Python lines, then ``-->``: hidden code run at that point of the page,
  in the page's namespace, so that fragments run as written (names a snippet assumes, such as
  a ``handle`` function or the data it publishes).

Before a block runs, these documented substitutions apply (see :func:`substitute`):

* addresses on NSQ's default ports (``HOST:4150``/``4151`` an nsqd, ``HOST:4250``/``4251`` a
  second nsqd, ``HOST:4160``/``4161`` nsqlookupd, any host) become the addresses of the
  embedded servers the runner started for the page (registered with one another); metrics
  ports ``9117``/``9118`` become free local ports;
* ``pip install ...`` is checked (the extras it names must exist in pyproject.toml) and not
  run: the test environment is installed already;
* ``nsq-sansio nsqd ... &`` / ``nsq-sansio lookupd ... &`` (servers started in the background)
  are not run: the runner's embedded servers stand in for them;
* ``nsq-sansio demo`` publishes at most 2,000 messages and draws no progress bars.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

RUN_LANGUAGES = {"python": "python", "py": "python", "sh": "sh", "bash": "sh", "shell": "sh"}
DEMO_MAX_MESSAGES = 2000

_FENCE = re.compile(r"^(?P<indent>[ \t]*)(?P<fence>`{3,}|~{3,})[ \t]*(?P<lang>[\w+-]*)[^\n]*$")
_NOT_RUN = re.compile(r"<!--\s*not-run:\s*(?P<reason>.*?)\s*-->", re.S)
_SETUP = re.compile(r"^<!--\s*(?:setup|check):[ \t]*\n(?P<code>.*?)^-->[ \t]*$", re.S | re.M)


@dataclass
class Block:
    """One fenced block (or a hidden setup) of a page."""

    path: Path
    line: int  # 1-based line of the opening fence (of the comment, for a setup)
    language: str  # "python", "sh", or the fence's own word for blocks not run
    code: str
    not_run: str | None = None  # the reason given by a not-run marker
    hidden: bool = False  # a setup comment, not shown on the page

    @property
    def where(self) -> str:
        try:
            name = self.path.relative_to(ROOT)
        except ValueError:
            name = self.path
        return f"{name}:{self.line}"

    @property
    def runs(self) -> bool:
        return self.language in ("python", "sh") and self.not_run is None


@dataclass
class Page:
    path: Path
    blocks: list[Block] = field(default_factory=list)

    @property
    def runnable(self) -> list[Block]:
        return [block for block in self.blocks if block.runs]


def parse_page(path: Path, text: str | None = None) -> Page:
    """Every fenced block and setup comment of one Markdown file, in page order."""
    text = path.read_text(encoding="utf-8") if text is None else text
    lines = text.split("\n")
    items: list[tuple[int, Block]] = []
    for match in _SETUP.finditer(text):
        line = text.count("\n", 0, match.start()) + 1
        items.append((line, Block(path, line, "python", match.group("code"), hidden=True)))
    index = 0
    while index < len(lines):
        opening = _FENCE.match(lines[index])
        if opening is None:
            index += 1
            continue
        indent, fence = opening.group("indent"), opening.group("fence")
        body: list[str] = []
        end = index + 1
        while end < len(lines):
            stripped = lines[end].strip()
            if stripped.startswith(fence[0] * len(fence)) and not stripped.strip(fence[0]):
                break
            body.append(lines[end][len(indent) :] if lines[end].startswith(indent) else lines[end])
            end += 1
        raw = opening.group("lang").lower()
        language = RUN_LANGUAGES.get(raw, raw or "text")
        block = Block(path, index + 1, language, "\n".join(body) + "\n")
        block.not_run = _marker_before(lines, index)
        items.append((index + 1, block))
        index = end + 1
    items.sort(key=lambda item: item[0])
    return Page(path, [block for _, block in items])


def _marker_before(lines: list[str], index: int) -> str | None:
    """The reason of a ``<!-- not-run: ... -->`` ending on the line before the fence."""
    end = index - 1
    while end >= 0 and not lines[end].strip():
        end -= 1
    if end < 0 or not lines[end].rstrip().endswith("-->"):
        return None
    start = end
    while start >= 0 and "<!--" not in lines[start]:
        start -= 1
    match = _NOT_RUN.search("\n".join(lines[max(start, 0) : end + 1]))
    return " ".join(match.group("reason").split()) if match else None


def doc_pages() -> list[Path]:
    """README.md and every Markdown page under docs/ (the generated reference included)."""
    return [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]


# -- substitutions ------------------------------------------------------------------------------

_HOST = r"(?:\[[0-9A-Fa-f:.]+\]|[A-Za-z0-9](?:[A-Za-z0-9.-]*[A-Za-z0-9])?)?"
_ADDRESS = re.compile(
    rf"(?<![\w.:-])(?P<host>{_HOST}):(?P<port>4150|4151|4160|4161|4250|4251|9117|9118)\b"
)
_PIP = re.compile(r"(?:\bpython3?\s+-m\s+)?\bpip\s+install\b[^\n&|;#]*")
_EXTRAS = re.compile(r"\[([\w,\s-]+)\]")
_BACKGROUND_SERVER = re.compile(
    r"^[ \t]*nsq-sansio[ \t]+(?:nsqd|lookupd)\b(?:[^\n#\\]|\\\n)*&[ \t]*(?:#.*)?$", re.M
)
_DEMO = re.compile(r"\bnsq-sansio[ \t]+demo\b(?P<args>[^\n&|;#]*)")
_MESSAGES = re.compile(r"(?P<flag>-n|--messages)(?P<sep>[ \t=]+)(?P<count>\d[\d_,]*)")


def substitute(code: str, language: str, addresses: dict[str, str]) -> str:
    """``code`` with the documented substitutions applied (module docstring).

    ``addresses`` maps the default ports ("4150", "4161", "9117"...) to ``host:port`` of the
    servers and free ports of this run.
    """

    def address(match: re.Match[str]) -> str:
        return addresses[match.group("port")]

    code = _ADDRESS.sub(address, code)
    if language != "sh":
        return code
    code = _BACKGROUND_SERVER.sub(": # the embedded servers of the docs test stand in", code)
    code = _PIP.sub("true ", code)

    def demo(match: re.Match[str]) -> str:
        args = match.group("args")
        if _MESSAGES.search(args):
            args = _MESSAGES.sub(
                lambda m: (
                    f"{m.group('flag')}{m.group('sep')}"
                    f"{min(int(re.sub('[_,]', '', m.group('count'))), DEMO_MAX_MESSAGES)}"
                ),
                args,
            )
        else:
            args = f" --messages {DEMO_MAX_MESSAGES}{args}"
        if "--no-progress" not in args:
            args = args.rstrip() + " --no-progress "
        return f"nsq-sansio demo{args}"

    return _DEMO.sub(demo, code)


def pip_extras(code: str) -> list[str]:
    """The extras named by the ``pip install`` commands of a block (``'.[cli,spark]'``)."""
    extras: list[str] = []
    for command in _PIP.findall(code):
        for group in _EXTRAS.findall(command):
            extras += [name.strip() for name in group.split(",") if name.strip()]
    return extras


def known_extras() -> set[str]:
    """The optional-dependency groups pyproject.toml defines (read without tomllib, which
    Python 3.10 lacks)."""
    text = (ROOT / "pyproject.toml").read_text(encoding="utf-8")
    section = text.split("[project.optional-dependencies]", 1)[1].split("\n[", 1)[0]
    return set(re.findall(r"^([A-Za-z][\w-]*)\s*=", section, flags=re.M))
