"""The project's command line against real nsqd processes.

`stat --topic X` over several nsqd of which one lacks X: nsqd answers ``"topics": null`` there
(Go's nil slice), which must read as "no topics", not crash.
"""

from __future__ import annotations

import pytest

from transports.cli import main

from .conftest import start_real_nsqd


def test_stat_over_two_nsqd_when_one_lacks_the_topic(capsys: pytest.CaptureFixture[str]) -> None:
    with_topic, without = start_real_nsqd(), start_real_nsqd()
    try:
        with_topic.post("/mpub?topic=only_here", b"a\nb\nc")
        code = main(
            [
                "stat",
                f"--nsqd-http-address={with_topic.http_address}",
                f"--nsqd-http-address={without.http_address}",
                "--topic=only_here",
                "--count=1",
            ]
        )
    finally:
        with_topic.close()
        without.close()
    assert code == 0
    assert "only_here" in capsys.readouterr().out
