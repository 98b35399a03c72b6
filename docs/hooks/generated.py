"""Reference tables generated at build time from the code, so they cannot drift from it:

* the command line, from the ``argparse`` parsers the ``nsq-sansio`` commands run with;
* the Spark data source's options, from ``transports/spark/_options.py`` (the names it accepts,
  the defaults and ranges its parser applies, and the descriptions kept beside them).

A page asks for a table with an HTML comment on a line of its own, ``<!-- generated: cli -->``
or ``<!-- generated: spark-read-options -->``; the docs hook replaces it when the site is built.
"""

from __future__ import annotations

import argparse
import ast
import importlib
import inspect
import re
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
MARKER = re.compile(r"^<!-- generated: ([a-z-]+) -->$", re.M)

# -- the command line -------------------------------------------------------------------------

#: What builds each command's parser today (module, function), used when
#: ``transports.cli.main`` has no ``build_parser()`` of its own.
_PARSER_BUILDERS = {
    "demo": ("transports.cli.demo.command", "build_parser"),
    "tail": ("transports.cli.tail", "_tail_parser"),
    "pub": ("transports.cli.pub", "_pub_parser"),
    "stat": ("transports.cli.stat", "_stat_parser"),
    "to-file": ("transports.cli.to_file", "_to_file_parser"),
    "nsqd": ("transports.cli.servers", "_nsqd_parser"),
    "lookupd": ("transports.cli.servers", "_lookupd_parser"),
}


def _subparsers(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            return dict(action.choices)
    return {}


def cli_parsers() -> dict[str, argparse.ArgumentParser]:
    """Every command's parser, by command name, in the order ``nsq-sansio --help`` lists them."""
    cli_main = importlib.import_module("transports.cli.main")
    commands: tuple[str, ...] = tuple(cli_main.COMMANDS)
    build: Callable[..., Any] | None = getattr(cli_main, "build_parser", None)
    if build is not None:
        required = [
            parameter
            for parameter in inspect.signature(build).parameters.values()
            if parameter.default is inspect.Parameter.empty
            and parameter.kind in (parameter.POSITIONAL_ONLY, parameter.POSITIONAL_OR_KEYWORD)
        ]
        if required:  # build_parser(command): one parser per command
            return {name: build(name) for name in commands}
        built = build()
        found = built if isinstance(built, dict) else _subparsers(built)
        if found:
            return {name: found[name] for name in commands if name in found}
    parsers: dict[str, argparse.ArgumentParser] = {}
    for name in commands:
        module_name, function = _PARSER_BUILDERS[name]
        parsers[name] = getattr(importlib.import_module(module_name), function)()
    return parsers


def _cell(text: str) -> str:
    return " ".join(text.split()).replace("|", "\\|")


def _default(action: argparse.Action) -> str:
    default = action.default
    if default is None or default is argparse.SUPPRESS or default == []:
        return ""
    if isinstance(action, (argparse._StoreTrueAction, argparse._StoreFalseAction)):
        return ""
    if isinstance(default, float) and default.is_integer():
        default = int(default)
    return f"`{default}`"


def _flags(action: argparse.Action) -> str:
    # ``--name`` and one-letter ``-n``; Go's ``-name`` spelling is accepted too (said once, above)
    names = [
        name for name in action.option_strings if name.startswith("--") or len(name) == 2
    ] or list(action.option_strings)
    if not names:  # a positional argument
        return f"`{action.metavar or action.dest}`"
    takes_value = action.nargs != 0
    metavar = ""
    if takes_value:
        if action.choices is not None and action.metavar is None:
            metavar = " {" + ",".join(str(choice) for choice in action.choices) + "}"
        else:
            metavar = " " + str(action.metavar or action.dest.upper())
        if action.nargs == "?":
            metavar = f" [{metavar.strip()}]"
    return ", ".join(f"`{name}{metavar}`" for name in names)


def _help(parser: argparse.ArgumentParser, action: argparse.Action) -> str:
    if not action.help:
        return ""
    formatter = parser._get_formatter()
    text = formatter._expand_help(action)
    if isinstance(action, argparse._AppendAction):
        text = text or "may be given multiple times"
    return _cell(text)


def render_cli() -> str:
    """The reference of every ``nsq-sansio`` command: usage, then one table per option group."""
    out: list[str] = []
    for name, parser in cli_parsers().items():
        out.append(f"## `nsq-sansio {name}` {{#{name}}}\n")
        if parser.description:
            out.append(_cell(parser.description) + "\n")
        out.append("```text\n" + parser.format_usage().strip() + "\n```\n")
        for group in parser._action_groups:
            actions = [
                action
                for action in group._group_actions
                if action.help is not argparse.SUPPRESS
                and not isinstance(action, argparse._HelpAction)
            ]
            if not actions:
                continue
            title = group.title or "options"
            if title in ("optional arguments", "options"):
                title = "options"
            out.append(f"**{title}**\n")
            out.append("| flag | default | meaning |\n| --- | --- | --- |")
            for action in actions:
                out.append(f"| {_flags(action)} | {_default(action)} | {_help(parser, action)} |")
            out.append("")
    return "\n".join(out)


# -- the Spark data source's options ------------------------------------------------------------


def spark_options() -> Any:
    """``transports/spark/_options.py``, loaded on its own: the package's ``__init__`` imports
    pyspark, which building the docs does not need."""
    import importlib.util

    name = "_nsq_docs_spark_options"
    if name in sys.modules:
        return sys.modules[name]
    path = ROOT / "transports" / "spark" / "_options.py"
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


_PARSERS = {"_int": "integer", "_float": "number", "_bool": "boolean"}


def _spark_ranges() -> dict[str, tuple[str, str, str]]:
    """option -> (type, default, allowed) read from the ``_int/_float/_bool`` calls of the
    options parser (the code that applies them)."""
    _options = spark_options()

    tree = ast.parse(inspect.getsource(_options))
    namespace = vars(_options)
    found: dict[str, tuple[str, str, str]] = {}

    def value(node: ast.expr) -> str:
        try:
            result = eval(compile(ast.Expression(node), "<options>", "eval"), dict(namespace))
        except Exception:
            return ast.unparse(node)
        if isinstance(result, float) and result.is_integer():
            result = int(result)
        if isinstance(result, int) and not isinstance(result, bool) and abs(result) >= 10_000:
            return f"{result:_}"
        return str(result).lower() if isinstance(result, bool) else str(result)

    # ``for name in ("snappy", "deflate"): _bool(opts, name, False)`` names its options through
    # a loop variable: map such variables to the constants they go through.
    loop_names: dict[int, tuple[str, ...]] = {}
    for loop in ast.walk(tree):
        if (
            isinstance(loop, ast.For)
            and isinstance(loop.target, ast.Name)
            and isinstance(loop.iter, ast.Tuple)
            and all(isinstance(e, ast.Constant) for e in loop.iter.elts)
        ):
            values = tuple(str(e.value) for e in loop.iter.elts)  # type: ignore[attr-defined]
            for inner in ast.walk(loop):
                if isinstance(inner, ast.Name) and inner.id == loop.target.id:
                    loop_names[id(inner)] = values
    for node in ast.walk(tree):
        if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Name)):
            continue
        kind = _PARSERS.get(node.func.id)
        if kind is None or len(node.args) < 3:
            continue
        name_node = node.args[1]
        if isinstance(name_node, ast.Constant) and isinstance(name_node.value, str):
            names: tuple[str, ...] = (name_node.value,)
        else:
            names = loop_names.get(id(name_node), ())
        default = value(node.args[2])
        allowed = (
            "`true` / `false`"
            if kind == "boolean"
            else f"{value(node.args[3])} .. {value(node.args[4])}"
        )
        for name in names:
            found.setdefault(name, (kind, default, allowed))
    return found


def _check_spark_option_lists() -> None:
    """The reference's lists are exactly what the parser accepts (no option left out)."""
    _options = spark_options()

    spark_own = {"path", "checkpointlocation"}  # Spark passes these; not the user's options
    for role, listed, accepted in (
        ("read", _options.READ_OPTIONS, _options._COMMON | _options._READ),
        ("write", _options.WRITE_OPTIONS, _options._COMMON | _options._WRITE),
    ):
        shown = set(listed) | set(_options.CONNECTION_OPTIONS)
        if shown != accepted - spark_own:
            raise ValueError(
                f"transports/spark/_options.py: the {role} options listed for the reference "
                f"differ from those accepted: {sorted(shown ^ (accepted - spark_own))}"
            )
    undocumented = (shown | set(_options.READ_OPTIONS)) - set(_options.OPTION_DOCS)
    if undocumented:
        raise ValueError(f"no OPTION_DOCS entry for {sorted(undocumented)}")


def _spark_table(names: tuple[str, ...]) -> str:
    _options = spark_options()

    _check_spark_option_lists()
    ranges = _spark_ranges()
    allowed_text = {"serialization": " / ".join(f"`{v}`" for v in _options.SERIALIZATIONS)}
    out = ["| option | type | default | allowed | meaning |", "| --- | --- | --- | --- | --- |"]
    for name in names:
        kind, default, allowed = ranges.get(name, ("text", "", ""))
        default = _options.OPTION_DEFAULTS.get(name, f"`{default}`" if default else "")
        allowed = allowed_text.get(name, allowed)
        meaning = _cell(_options.OPTION_DOCS[name])
        out.append(f"| `{name}` | {kind} | {default} | {allowed} | {meaning} |")
    return "\n".join(out) + "\n"


def render_spark_read_options() -> str:
    """The table of the source's own options (``spark.readStream.format("nsq")``)."""
    _options = spark_options()

    return _spark_table(_options.READ_OPTIONS)


def render_spark_write_options() -> str:
    """The table of the sink's own options (``df.write``/``writeStream.format("nsq")``)."""
    _options = spark_options()

    return _spark_table(_options.WRITE_OPTIONS)


def render_spark_connection_options() -> str:
    """The table of the connection options both take (compression, TLS, AUTH...)."""
    _options = spark_options()

    return _spark_table(_options.CONNECTION_OPTIONS)


GENERATORS: dict[str, Callable[[], str]] = {
    "cli": render_cli,
    "spark-read-options": render_spark_read_options,
    "spark-write-options": render_spark_write_options,
    "spark-connection-options": render_spark_connection_options,
}


def expand(markdown: str) -> str:
    """``markdown`` with every ``<!-- generated: NAME -->`` line replaced by its table."""

    def replace(match: re.Match[str]) -> str:
        name = match.group(1)
        if name not in GENERATORS:
            raise KeyError(f"unknown generated section {name!r} (known: {sorted(GENERATORS)})")
        return GENERATORS[name]()

    return MARKER.sub(replace, markdown)
