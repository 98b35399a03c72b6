"""The ``nsq-sansio`` entry point: reads the command name and hands the rest of the arguments to
that command's module, imported only then (so ``nsq-sansio tail`` does not load the demo). Every
failure to start is one line on stderr: exit code 2 for a wrong command line, 1 for the rest
(:func:`~transports.cli.common.run_reporting_errors`).

:func:`build_parser` returns the whole command line as one ``ArgumentParser`` (a sub-parser per
command) for documentation generators; :func:`command_parser` one command's parser.
"""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Callable, Sequence

from .common import EXIT_USAGE, run_reporting_errors

__all__ = ["COMMANDS", "build_parser", "command_parser", "main"]


COMMANDS = ("demo", "tail", "pub", "stat", "to-file", "redrive", "nsqd", "lookupd")


_USAGE = """usage: nsq-sansio <command> [options]   (nsq-sansio <command> --help)

commands:
  demo      embedded lookupd + 2 nsqd in this process; publish a workload, consume it on a
            push channel (2 consumers) and a pull channel, with retries, backoff and give-ups;
            exit 0 only if every message is accounted for
  tail      print a topic's messages
  pub       publish lines of stdin (or a file) to a topic, MPUB batches, rate limit
  stat      live table of topic/channel depth, in-flight and rates (from every nsqd's /stats)
  to-file   archive a channel to rolling files, FIN after fsync
  redrive   move messages from a dead-letter topic back to their source topic, rate limited
  nsqd      run an embedded nsqd (nsqd's flags)
  lookupd   run an embedded nsqlookupd (nsqlookupd's flags)
"""


# command -> (module, its *_main, its parser builder)
_MODULES = {
    "demo": ("demo", "demo_main", "build_parser"),
    "tail": ("tail", "tail_main", "build_parser"),
    "pub": ("pub", "pub_main", "build_parser"),
    "stat": ("stat", "stat_main", "build_parser"),
    "to-file": ("to_file", "to_file_main", "build_parser"),
    "redrive": ("redrive", "redrive_main", "build_parser"),
    "nsqd": ("servers", "nsqd_main", "build_nsqd_parser"),
    "lookupd": ("servers", "lookupd_main", "build_lookupd_parser"),
}


def _attribute(command: str, index: int) -> Callable[..., object]:
    module_name = _MODULES[command][0]
    module = importlib.import_module(f".{module_name}", __package__)
    function: Callable[..., object] = getattr(module, _MODULES[command][index])
    return function


def _dispatch(command: str) -> Callable[[Sequence[str]], int]:
    """The command's ``*_main``, its module imported only now."""
    return _attribute(command, 1)  # type: ignore[return-value]


def command_parser(command: str) -> argparse.ArgumentParser:
    """The ``ArgumentParser`` of one command (``"tail"``, ``"to-file"``...)."""
    parser = _attribute(command, 2)()
    if not isinstance(parser, argparse.ArgumentParser):
        raise TypeError(f"{command}: its parser builder returned {type(parser).__name__}")
    return parser


def build_parser() -> argparse.ArgumentParser:
    """The whole command line as one parser, one sub-parser per command (each built by its
    module, with the same flags, help and groups), for documentation and tests; ``main``
    dispatches by hand so a command imports only its own module."""
    parser = argparse.ArgumentParser(
        prog="nsq-sansio",
        description="Command line tools for NSQ: nsq-sansio <command> --help for each.",
    )
    commands = parser.add_subparsers(dest="command", metavar="<command>", required=True)
    for name in COMMANDS:
        own = command_parser(name)
        commands.add_parser(
            name,
            parents=[own],
            add_help=False,
            help=_SUMMARIES[name],
            description=own.description,
        )
    return parser


_SUMMARIES = {
    "demo": "embedded lookupd + 2 nsqd; publish, consume on two channels, account for all",
    "tail": "print a topic's messages",
    "pub": "publish lines of stdin (or a file) to a topic",
    "stat": "live table of topic/channel depth, in-flight and rates",
    "to-file": "archive a channel to rolling files, FIN after fsync",
    "redrive": "move messages from a dead-letter topic back to their source topic",
    "nsqd": "run an embedded nsqd (nsqd's flags)",
    "lookupd": "run an embedded nsqlookupd (nsqlookupd's flags)",
}


def main(argv: Sequence[str] | None = None) -> int:
    """The ``nsq-sansio`` entry point; returns the exit code."""
    args = list(sys.argv[1:] if argv is None else argv)
    if not args:
        print(_USAGE, end="", file=sys.stderr)
        return 2
    if args[0] in ("-h", "--help", "help"):
        print(_USAGE, end="")
        return 0
    if args[0] in ("-V", "--version", "version"):
        from nsq_sansio import __version__

        print(f"nsq-sansio {__version__}")
        return 0
    command = "lookupd" if args[0] == "nsqlookupd" else args[0]
    if command not in COMMANDS:
        print(
            f"nsq-sansio: unknown command {command!r} (nsq-sansio --help lists the commands)",
            file=sys.stderr,
        )
        return EXIT_USAGE
    return run_reporting_errors(command, lambda: _dispatch(command)(args[1:]))


if __name__ == "__main__":
    sys.exit(main())
