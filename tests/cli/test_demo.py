"""``nsq-sansio demo``: small runs on every runtime, and the accounting it exits on."""

from __future__ import annotations

import re

import pytest

from transports.demo import DemoOptions, DemoResult, Tally, Workload, format_report

from .conftest import cli

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
    assert "publish  [" in result.stderr.decode()


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
