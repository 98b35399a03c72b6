"""docs/logging.md lists every message the library logs, at its level, with the fields the call
gives, and every logger; nothing it lists is gone. The source is read, not run: a new log line
without its entry on the page fails here."""

from __future__ import annotations

import ast
import re
from dataclasses import dataclass
from pathlib import Path

import pytest

from transports._common import logs

ROOT = Path(__file__).resolve().parents[2]
PAGE = ROOT / "docs" / "logging.md"
SOURCES = [ROOT / "transports", ROOT / "nsq_sansio"]

LEVELS = {
    "debug": "DEBUG",
    "info": "INFO",
    "warning": "WARNING",
    "error": "ERROR",
    "exception": "ERROR",
    "critical": "CRITICAL",
}
#: What a logging call is made on: a logger or a ConnectionLogger, as this code names them.
LOGGER = re.compile(r"(^|\.)_?log(ger)?$|^ConnectionLogger\(|^logging\.getLogger\(")
ROW = re.compile(r"^\| `(?P<message>[^`]+)` \| (?P<level>[A-Z]+) \| (?P<fields>[^|]*) \|")


@dataclass(frozen=True)
class Call:
    where: str
    message: str | None  # None: not a literal
    level: str | None  # None: not known from the source
    fields: frozenset[str]


def _fields_of(call: ast.Call) -> frozenset[str]:
    """The ``nsq_*`` names of ``extra=fields(...)``'s keywords."""
    for keyword in call.keywords:
        if keyword.arg == "extra" and isinstance(keyword.value, ast.Call):
            return frozenset(f"nsq_{k.arg}" for k in keyword.value.keywords if k.arg)
    return frozenset()


def _level_of(node: ast.expr) -> str | None:
    if (
        isinstance(node, ast.Attribute)
        and isinstance(node.value, ast.Name)
        and node.value.id == "logging"
        and node.attr in LEVELS.values()
    ):
        return node.attr
    return None


def logging_calls() -> list[Call]:
    calls: list[Call] = []
    for root in SOURCES:
        for path in sorted(root.rglob("*.py")):
            tree = ast.parse(path.read_text(encoding="utf-8"))
            for node in ast.walk(tree):
                if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)):
                    continue
                method = node.func.attr
                if method not in LEVELS and method != "log":
                    continue
                if not LOGGER.search(ast.unparse(node.func.value)):
                    continue
                args = list(node.args)
                level = LEVELS.get(method)
                if method == "log":
                    level = _level_of(args.pop(0)) if args else None
                first = args[0] if args else None
                message = (
                    first.value
                    if isinstance(first, ast.Constant) and isinstance(first.value, str)
                    else None
                )
                where = f"{path.relative_to(ROOT)}:{node.lineno}"
                calls.append(Call(where, message, level, _fields_of(node)))
    return calls


def page_rows() -> dict[tuple[str, str], set[str]]:
    rows: dict[tuple[str, str], set[str]] = {}
    in_messages = False
    for line in PAGE.read_text(encoding="utf-8").splitlines():
        if line.startswith("## "):
            in_messages = line == "## Messages"
        match = ROW.match(line) if in_messages else None
        if match:
            key = (match["message"], match["level"])  # (one text, two places: both fields)
            rows.setdefault(key, set()).update(re.findall(r"`(nsq_\w+)`", match["fields"]))
    return rows


def test_the_scan_finds_the_logging_calls() -> None:
    """(So an empty scan cannot pass the tests below.)"""
    messages = {c.message for c in logging_calls()}
    assert "giving up on message %s after %d attempts; it was FIN'd" in messages
    assert "nsqd: timer failed" in messages
    assert len(messages) > 40


def test_every_message_is_a_literal_with_a_known_level() -> None:
    bad = [c.where for c in logging_calls() if c.message is None or c.level is None]
    assert not bad, f"log calls whose message or level is not a literal (say it in text): {bad}"


def test_every_logged_message_is_on_the_page_with_its_fields() -> None:
    rows = page_rows()
    missing: list[str] = []
    for call in logging_calls():
        if call.message is None or call.level is None:
            continue
        documented = rows.get((call.message, call.level))
        if documented is None:
            missing.append(f"{call.where}: {call.level} {call.message!r} is not on the page")
        elif not call.fields <= documented:
            missing.append(
                f"{call.where}: {call.message!r} gives {sorted(call.fields - documented)}, "
                "which its row does not list"
            )
    assert not missing, "\n".join(missing)


def test_every_message_on_the_page_is_logged() -> None:
    logged = {(c.message, c.level) for c in logging_calls()}
    gone = [key for key in page_rows() if key not in logged]
    assert not gone, f"on docs/logging.md but logged nowhere: {gone}"


def test_every_field_is_described() -> None:
    """Each ``fields()`` keyword's name is in the page's table of fields, and nothing more."""
    text = PAGE.read_text(encoding="utf-8")
    section = text.split("## Fields", 1)[1].split("\n## ", 1)[0]
    described = set(re.findall(r"^\| `(nsq_\w+)` \|", section, re.MULTILINE))
    names = {f"nsq_{name}" for name in logs.fields.__kwdefaults__ or {}}
    assert described == names


def _logger_names() -> set[str]:
    names: set[str] = set()
    for root in SOURCES:
        for path in root.rglob("*.py"):
            for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
                if (
                    isinstance(node, ast.Call)
                    and ast.unparse(node.func) == "logging.getLogger"
                    and node.args
                    and isinstance(node.args[0], ast.Constant)
                ):
                    names.add(str(node.args[0].value))
    return names


def test_every_logger_is_under_one_root_and_listed() -> None:
    names = _logger_names() - {logs.ROOT_LOGGER}
    assert names and all(n.startswith(logs.ROOT_LOGGER + ".") for n in names), names
    text = PAGE.read_text(encoding="utf-8")
    section = text.split("## Loggers", 1)[1].split("\n## ", 1)[0]
    listed = set(re.findall(r"^\| `([\w.]+)` \|", section, re.MULTILINE))
    assert listed == names


@pytest.mark.parametrize(
    ("raw", "text"),
    [(b"0a1b2c3d4e5f6789", "0a1b2c3d4e5f6789"), (b"\x00\xff'", "00ff27"), (b"", "")],
)
def test_message_ids_are_hex_text(raw: bytes, text: str) -> None:
    assert logs.message_id_text(raw) == text
    assert logs.fields(message_id=raw) == {"nsq_message_id": text}
