"""``nsq-sansio demo``: small runs on every runtime, and the accounting it exits on."""

from __future__ import annotations

import itertools
import re

import pytest

from transports.cli.demo import DemoOptions, DemoResult, Tally, Workload, format_report

from .conftest import cli, cli_in_pty, screen_lines

pytestmark = pytest.mark.timeout(30)


def _table(stdout: str) -> dict[str, list[str]]:
    rows = {}
    for line in stdout.splitlines():
        cells = re.split(r"\s{2,}", line.strip())
        if len(cells) == 3:
            rows[cells[0]] = cells[1:]
    return rows


@pytest.mark.timeout(90)
@pytest.mark.parametrize(
    "extra",
    [
        ["--runtime", "asyncio", "--compression", "snappy"],
        ["--runtime", "trio", "--compression", "deflate", "--tls"],
        ["--runtime", "blocking", "--tls"],
    ],
    ids=["asyncio-snappy", "trio-deflate-tls", "blocking-tls"],
)
def test_demo_accounts_for_every_message(extra: list[str]) -> None:
    if "trio" in extra:
        pytest.importorskip("trio")
    result = cli("demo", "-n", "2000", "--give-ups", "2", "--timeout", "60", *extra, timeout=80)
    out = result.stdout.decode()
    assert result.returncode == 0, out + result.stderr.decode()
    assert "OK: every message accounted for" in out
    rows = _table(out)
    assert rows["published"] == ["2,000", "2,000"]
    assert rows["finished"] == ["1,998", "1,998"]
    assert rows["given up"] == ["2", "2"]
    assert rows["duplicates"] == ["0", "0"]
    assert rows["unaccounted"] == ["0", "0"]
    # ~1% fail once, the 2 poison messages fail max_attempts (3) times each
    workload = Workload(DemoOptions(messages=2000, give_ups=2))
    first_failures = sum(
        1 for s in range(2000) if workload.fails_first(s) and not workload.is_poison(s)
    )
    for requeued in rows["requeued"]:
        assert int(requeued.replace(",", "")) >= first_failures + 2 * 3
    # progress is drawn on stderr (plain lines when it is not a terminal)
    assert "] publish 100.0% 2,000/2,000" in result.stderr.decode()


def test_demo_bad_option_is_one_line() -> None:
    result = cli("demo", "--size", "4")
    assert result.returncode == 2
    assert result.stderr.decode().strip() == "nsq-sansio demo: --size must be >= 16 bytes, got 4"


# --- the accounting itself (no sockets) ------------------------------------------------------


def _finished_run(messages: int = 10) -> tuple[DemoResult, Workload]:
    options = DemoOptions(messages=messages, give_ups=1, progress=False)
    workload = Workload(options)
    tally = Tally(workload)
    tally.add_published(messages, deferred=False)
    for ch in tally.channels.values():
        for seq in range(messages):
            body = workload.body(seq)
            if workload.is_poison(seq):
                ch.record_give_up(body)
            else:
                ch.record_finish(body, attempts=1)
    return DemoResult(options, tally), workload


def test_accounting_ok_when_every_message_ends_once() -> None:
    result, _ = _finished_run()
    assert result.problems() == []
    assert "OK: every message accounted for" in format_report(result)


def test_redelivery_with_higher_attempts_is_a_retry_not_a_duplicate() -> None:
    result, workload = _finished_run()
    push = result.tally.channels["push"]
    push.record_finish(workload.body(3), attempts=2)  # nsqd timed it out and sent it again
    assert push.redelivered == 1 and push.duplicates == 0
    assert result.ok


def test_duplicate_missing_and_wrong_give_up_fail_the_run() -> None:
    result, workload = _finished_run()
    push, pull = result.tally.channels["push"], result.tally.channels["pull"]
    push.record_finish(workload.body(3), attempts=1)  # same delivery finished twice
    pull.state[4] = 0  # never ended
    pull.finished -= 1
    problems = result.problems()
    assert any("push: 1 duplicates" in p for p in problems)
    assert any("pull: 1 messages neither finished nor given up (first: 4)" in p for p in problems)
    assert not result.ok
    assert "FAILED" in format_report(result)


# --- progress: fitted to a terminal, compact when piped --------------------------------------

_STAGE_LINE = re.compile(r"^(publish|push|pull)\s+\[[#-]+\]\s+\d+\.\d%")
_PLAIN_LINE = re.compile(r"^\[\s*(\d+):(\d\d)\] (publish|push|pull) (\d+\.\d)% ")


@pytest.mark.timeout(90)
def test_demo_progress_on_an_80_column_terminal_shows_every_field() -> None:
    code, output = cli_in_pty(
        "demo", "-n", "4000", "--give-ups", "2", "--runtime", "blocking", columns=80
    )
    assert code == 0, output
    lines = screen_lines(output)
    progress = [line for line in lines if _STAGE_LINE.match(line)]
    assert progress, output
    for line in lines:
        if "|" not in line and "---" not in line[:3]:  # not the closing table
            assert len(line) <= 80, repr(line)
    for line in progress:
        assert len(line) < 80 and "ETA " in line and "/s" in line, line
    # a channel's retries and give-ups are on its line or the next one, never cut off
    for i, line in enumerate(lines):
        if _STAGE_LINE.match(line) and not line.startswith("publish"):
            both = line + " " + (lines[i + 1] if i + 1 < len(lines) else "")
            assert re.search(r"retries \d", both) and re.search(r"gave up \d", both), both
    final_push = [line for line in progress if line.startswith("push")][-1]
    assert "100.0%" in final_push and "4,000/4,000" in final_push and "ETA 0:00" in final_push
    assert "OK: every message accounted for" in output


@pytest.mark.timeout(200)
def test_demo_progress_piped_is_one_short_line_per_stage_every_2s() -> None:
    # the two always-failing messages are retried 15 times, 0.05 s x attempts apart: the run
    # lasts a few periods however fast the machine is, waiting rather than computing (a
    # loaded machine, other test runs on 2 cores, is slower still: the long timeouts)
    result = cli(
        "demo", "-n", "4000", "--give-ups", "2", "--max-attempts", "15", "--timeout", "150",
        "--batch", "1", "--max-in-flight", "50", timeout=180,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    err = result.stderr.decode().splitlines()
    assert err and all("\x1b" not in line for line in err)
    stamps: dict[str, list[int]] = {"publish": [], "push": [], "pull": []}
    for line in err:
        match = _PLAIN_LINE.match(line)
        assert match, line
        assert len(line) < 100, line
        assert "ETA " in line and "/s " in line, line
        if match.group(3) != "publish":
            assert re.search(r"retries \d", line) and re.search(r"gave up \d", line), line
        stamps[match.group(3)].append(int(match.group(1)) * 60 + int(match.group(2)))
    # every period (2 s) one line per stage, in order; then the final three lines
    assert [_PLAIN_LINE.match(line).group(3) for line in err] == [  # type: ignore[union-attr]
        "publish",
        "push",
        "pull",
    ] * (len(err) // 3)
    for stage, seconds in stamps.items():
        assert len(seconds) >= 2, stage  # the run takes more than one period
        gaps = [b - a for a, b in itertools.pairwise(seconds[:-1])]
        assert all(gap >= 2 for gap in gaps), (stage, seconds)
    last = {stage: [line for line in err if f"] {stage} " in line][-1] for stage in stamps}
    assert "100.0% 4,000/4,000" in last["push"] and "ETA 0:00" in last["push"]


def test_spark_demo_accounting_flags_every_kind_of_loss() -> None:
    from collections import Counter

    from transports.cli.demo.spark import SparkDemoOptions, SparkDemoResult, expected_cells

    cells = expected_cells(300)
    good = SparkDemoResult(
        SparkDemoOptions(messages=300),
        published=301,
        clicks=300,
        malformed=0,
        streamed=301,
        cells_expected=cells,
        cells_written=Counter(cells),
        parquet_rows=len(cells),
        republished=len(cells),
        read_back=len(cells),
        read_back_matching=len(cells),
    )
    assert good.ok, good.problems()
    lost = Counter(cells)
    lost[next(iter(cells))] -= 1
    for change, words in [
        ({"streamed": 300, "left_on_channel": 1}, "1 left on the channel"),
        ({"cells_written": lost}, "1 (window, page) cells differ"),
        ({"republished": len(cells) - 1}, "republished"),
        ({"read_back_matching": len(cells) - 2}, "2 rows missing"),
        ({"read_back_duplicates": 1}, "1 duplicates"),
    ]:
        bad = SparkDemoResult(**{**{f: getattr(good, f) for f in good.__slots__}, **change})  # type: ignore[arg-type]
        assert not bad.ok and any(words in p for p in bad.problems()), (change, bad.problems())
