"""The ``nsq-sansio`` entry point: reads the command name and hands the rest of the arguments to
that command's module, imported only then (so ``nsq-sansio tail`` does not load the demo); a
:class:`~transports.cli.common.CLIError` becomes one line on stderr and exit code 1.
"""

from __future__ import annotations

import contextlib
import os
import sys
from collections.abc import Callable, Sequence

from nsq_sansio.errors import NSQError

from .common import CLIError

__all__ = ["COMMANDS", "main"]


COMMANDS = ("demo", "tail", "pub", "stat", "to-file", "nsqd", "lookupd")


_USAGE = """usage: nsq-sansio <command> [options]   (nsq-sansio <command> --help)

commands:
  demo      embedded lookupd + 2 nsqd in this process; publish a workload, consume it on a
            push channel (2 consumers) and a pull channel, with retries, backoff and give-ups;
            exit 0 only if every message is accounted for
  tail      print a topic's messages
  pub       publish lines of stdin (or a file) to a topic, MPUB batches, rate limit
  stat      live table of topic/channel depth, in-flight and rates (from every nsqd's /stats)
  to-file   archive a channel to rolling files, FIN after fsync
  nsqd      run an embedded nsqd (nsqd's flags)
  lookupd   run an embedded nsqlookupd (nsqlookupd's flags)
"""


def _dispatch(command: str) -> Callable[[Sequence[str]], int]:
    """The command's ``*_main``, its module imported only now."""
    if command == "demo":
        from .demo import demo_main

        return demo_main
    if command == "tail":
        from .tail import tail_main

        return tail_main
    if command == "pub":
        from .pub import pub_main

        return pub_main
    if command == "stat":
        from .stat import stat_main

        return stat_main
    if command == "to-file":
        from .to_file import to_file_main

        return to_file_main
    if command == "nsqd":
        from .servers import nsqd_main

        return nsqd_main
    from .servers import lookupd_main  # lookupd, nsqlookupd

    return lookupd_main


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
    command = args[0]
    if command not in COMMANDS and command != "nsqlookupd":
        print(f"nsq-sansio: unknown command {command!r}\n{_USAGE}", file=sys.stderr, end="")
        return 2
    try:
        return _dispatch(command)(args[1:])
    except CLIError as err:
        print(f"nsq-sansio {command}: {err}", file=sys.stderr)
        return 1
    except BrokenPipeError:  # `nsq-sansio tail ... | head`
        with contextlib.suppress(OSError):
            sys.stdout = open(os.devnull, "w")  # noqa: SIM115
        return 0
    except (NSQError, OSError, ValueError) as err:
        print(f"nsq-sansio {command}: {type(err).__name__}: {err}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
