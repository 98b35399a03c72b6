"""Failing to start, the same way in every command: one line on stderr, exit code 2 for a wrong
command line (a bad value, 0 where 0 makes no sense, contradictory flags), 1 for the rest (a
port in use, nothing answering, a missing package, a topic or channel ``stat`` cannot find).
And every option of every command says what it does."""

from __future__ import annotations

import argparse
import contextlib
import errno
import os
import shlex
import socket
import subprocess
import sys
from collections.abc import Iterator

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from transports.cli.main import COMMANDS, main
from transports.cli.stat import format_stats
from transports.embedded import EmbeddedNSQD
from transports.testing.real_nsq import MISSING_BINARIES, RealNSQD, find_binaries, tool

from .conftest import STAT_COLUMNS, _env, cli, http_post, one_line_error, stat_tables

pytestmark = pytest.mark.timeout(60)


def _options(
    parser: argparse.ArgumentParser, path: str = ""
) -> Iterator[tuple[str, argparse.Action]]:
    """Every option of ``parser`` and of its sub-parsers, with the command it belongs to."""
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                yield from _options(sub, f"{path} {name}".strip())
        elif not isinstance(action, argparse._HelpAction):
            yield path, action


def test_every_option_of_every_command_has_help() -> None:
    from transports.cli.main import build_parser  # the parser documentation is built from

    parser = build_parser()
    commands = {path for path, _ in _options(parser)}
    assert commands == set(COMMANDS)
    missing = [
        f"{path} {'/'.join(action.option_strings) or action.dest}"
        for path, action in _options(parser)
        if not action.help or action.help == argparse.SUPPRESS
    ]
    assert missing == []


def run_main(args: str, capsys: pytest.CaptureFixture[str]) -> tuple[int, list[str]]:
    """``nsq-sansio <args>`` in this process: its exit code and its stderr lines."""
    try:
        code = main(shlex.split(args))
    except SystemExit as exit:  # argparse's own exit
        code = int(exit.code or 0)
    return code, capsys.readouterr().err.strip().splitlines()


NSQD = "--nsqd-tcp-address 127.0.0.1:1"
HTTP = "--nsqd-http-address 127.0.0.1:1"

# (arguments, what the one line must name): refused before anything connects
REFUSED = [
    (f"stat {HTTP} --status-every 0", "--status-every"),
    (f"stat {HTTP} --interval 0s", "--interval"),
    (f"stat {HTTP} --count 0", "--count"),
    (f"stat {HTTP} --http-timeout 0", "--http-timeout"),
    (f"tail --topic t {NSQD} --max-in-flight 0", "--max-in-flight"),
    (f"tail --topic t {NSQD} -n -1", "-n"),
    (f"tail --topic t {NSQD} --connect-timeout 0", "--connect-timeout"),
    (f"tail --topic 'bad topic' {NSQD}", "invalid topic name"),
    (f"tail --topic t --channel 'bad channel' {NSQD}", "invalid channel name"),
    (f"pub --topic t {NSQD} --batch-size 0", "--batch-size"),
    (f"pub --topic t {NSQD} --rate -1", "--rate"),
    (f"pub --topic t {NSQD} --delimiter ''", "--delimiter"),
    (f"pub --topic t {NSQD} --snappy --deflate", "--snappy and --deflate"),
    (f"to-file --topic t {NSQD} --max-in-flight 0", "--max-in-flight"),
    (f"to-file --topic t {NSQD} --sync-interval 0", "--sync-interval"),
    (f"to-file --topic t {NSQD} --gzip-level 0", "--gzip-level"),
    (f"to-file --topic t {NSQD} --rotate-size -1", "--rotate-size"),
    ("lookupd --tombstone-lifetime 0", "--tombstone-lifetime"),
    ("nsqd --max-rdy-count 0", "--max-rdy-count"),
    ("nsqd --tcp-address 127.0.0.1:0 --http-address 127.0.0.1:0 --msg-timeout 0", "--msg-timeout"),
    ("demo --runtime nope", "--runtime"),
    ("demo -n 0", "--messages"),
    ("demo --batch 0", "--batch"),
]


@pytest.mark.parametrize(("args", "named"), REFUSED, ids=[args for args, _ in REFUSED])
def test_bad_values_are_one_usage_line(
    args: str, named: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """Exit 2 and one line naming the flag, in every command; nothing is contacted first
    (127.0.0.1:1 would answer "connection refused", exit 1)."""
    code, lines = run_main(args, capsys)
    assert (code, len(lines)) == (2, 1), lines
    command = args.split()[0]
    assert lines[0].startswith(f"nsq-sansio {command}: "), lines
    assert named in lines[0]


@pytest.mark.parametrize(
    ("command", "flag"),
    [
        ("nsqd", "--tcp-address"),
        ("nsqd", "--http-address"),
        ("lookupd", "--tcp-address"),
        ("lookupd", "--http-address"),
    ],
)
def test_port_in_use_is_one_line_naming_the_address(command: str, flag: str) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        busy = f"127.0.0.1:{taken.getsockname()[1]}"
        addresses = {"--tcp-address": "127.0.0.1:0", "--http-address": "127.0.0.1:0", flag: busy}
        result = cli(command, *(word for pair in addresses.items() for word in pair))
    line = one_line_error(result)
    assert result.returncode == 1
    reason = os.strerror(errno.EADDRINUSE)
    assert line == f"nsq-sansio {command}: cannot listen on {busy} ({flag}): {reason}"


@pytest.mark.parametrize(
    "args",
    [
        "nsqd --tcp-address 127.0.0.1:0 --http-address 127.0.0.1:0 --metrics-address :0",
        f"tail --topic t {NSQD} --metrics-address :0",
    ],
)
def test_missing_extra_is_one_failure_line(
    args: str, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setitem(sys.modules, "prometheus_client", None)  # import fails
    code, lines = run_main(args, capsys)
    assert (code, len(lines)) == (1, 1), lines
    assert "pip install 'nsq-sansio[metrics]'" in lines[0]


def test_missing_runtime_package_is_one_line_not_a_traceback() -> None:
    code = (
        "import sys; sys.modules['anyio'] = None; from transports.cli.main import main; "
        "sys.exit(main(['lookupd', '--tcp-address', '127.0.0.1:0', '--http-address', "
        "'127.0.0.1:0']))"
    )
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, timeout=30, env=_env()
    )
    line = one_line_error(result)
    assert result.returncode == 1
    assert (
        line
        == "nsq-sansio lookupd: needs the anyio package: python -m pip install 'nsq-sansio[cli]'"
    )


# --- stat: the table fits 80 columns; a topic or channel it cannot find is an error -----------

_NAME = st.text(alphabet="abcdefghijklmnopqrstuvwxyz0123456789._-", min_size=1, max_size=64)
_COUNT = st.integers(min_value=0, max_value=2**63 - 1)
_ROW = st.fixed_dictionaries(
    {
        field: _COUNT
        for field in (
            "nsqd",
            "lag",
            "depth",
            "in_flight",
            "deferred",
            "requeued",
            "timed_out",
            "messages",
            "clients",
        )
    }
)


@st.composite
def _stat_rows(draw: st.DrawFn) -> dict[tuple[str, str], dict[str, int]]:
    """What collect_stats returns: a row per topic, and one per channel of a topic."""
    rows = {}
    for topic in draw(st.sets(_NAME, max_size=3)):
        rows[(topic, "")] = draw(_ROW)
        for channel in draw(st.sets(_NAME, max_size=3)):
            rows[(topic, channel)] = draw(_ROW)
    return rows


@settings(max_examples=200, deadline=None)
@given(
    rows=_stat_rows(),
    interval=st.floats(min_value=0.001, max_value=3600),
    with_previous=st.booleans(),
)
def test_stat_table_fits_80_columns_and_keeps_every_name_whole(
    rows: dict[tuple[str, str], dict[str, int]], interval: float, with_previous: bool
) -> None:
    previous = {key: dict(row, messages=0) for key, row in rows.items()} if with_previous else None
    text = format_stats(rows, previous, interval)
    assert max(len(line) for line in text.splitlines()) <= 80, text
    (table,) = stat_tables(text)
    assert set(table) == set(rows)  # every name in full, on a line of its own if need be
    for cells in table.values():
        assert len(cells) == len(STAT_COLUMNS)


@pytest.mark.parametrize("broker", ["embedded", "real"])
def test_stat_of_a_topic_or_channel_no_nsqd_has_is_an_error_as_in_nsq_stat(
    broker: str, nsqd: EmbeddedNSQD
) -> None:
    with contextlib.ExitStack() as stack:
        http_address = nsqd.http_address
        if broker == "real":
            if find_binaries() is None:
                pytest.skip(MISSING_BINARIES)
            http_address = stack.enter_context(RealNSQD([])).http_address
        http_post(http_address, "/topic/create?topic=orders")
        http_post(http_address, "/channel/create?topic=orders&channel=billing")
        ours = {
            channel: cli(
                "stat",
                "--nsqd-http-address",
                http_address,
                "--topic",
                "orders",
                "--channel",
                channel,
                "--count",
                "1",
            )
            for channel in ("billing", "nope")
        }
        missing_topic = cli("stat", "--nsqd-http-address", http_address, "--topic", "nope")
        nsq_stat = tool("nsq_stat")
        theirs = {
            channel: subprocess.run(
                [
                    str(nsq_stat),
                    f"--nsqd-http-address={http_address}",
                    "--topic=orders",
                    f"--channel={channel}",
                    "--count=1",
                    "--interval=100ms",
                ],
                capture_output=True,
                timeout=20,
            )
            for channel in ("billing", "nope")
            if nsq_stat is not None
        }
    assert ours["billing"].returncode == 0, ours["billing"].stderr
    assert one_line_error(ours["nope"]) == (
        "nsq-sansio stat: channel 'nope' not found in topic 'orders' on 1 nsqd"
    )
    assert ours["nope"].returncode == 1
    assert one_line_error(missing_topic) == "nsq-sansio stat: topic 'nope' not found on 1 nsqd"
    if theirs:  # nsq_stat agrees: the channel it finds is fine, the other is an error
        assert theirs["billing"].returncode == 0, theirs["billing"].stderr
        assert theirs["nope"].returncode == 1
        assert b"failed to find channel(nope)" in theirs["nope"].stderr
