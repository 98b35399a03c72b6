"""The helper that runs the real NSQ binaries: finds them, starts nsqd + nsqlookupd, stops them.

Skipped where the binaries are absent (a user's clone has no ``../shared``).
"""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from transports.testing.real_nsq import RealLookupd, RealNSQD, find_binaries

pytestmark = pytest.mark.skipif(find_binaries() is None, reason="real NSQ binaries not found")


def test_real_nsqd_registers_with_real_lookupd_and_keeps_messages_across_restart() -> None:
    with RealLookupd() as lookupd, RealNSQD(lookupd=[lookupd.tcp_address]) as nsqd:
        assert nsqd.get_json("/info")["version"] == "1.3.0"
        assert nsqd.post("/pub?topic=real_helper", b"hello") == b"OK"
        topic = nsqd.topic_stats("real_helper")
        assert topic is not None and topic["message_count"] == 1
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            producers = lookupd.get_json("/lookup?topic=real_helper").get("producers") or []
            if producers:
                break
            time.sleep(0.05)
        assert [p["tcp_port"] for p in producers] == [nsqd.tcp_port]
        nsqd.post("/channel/create?topic=real_helper&channel=c")
        nsqd.stop()
        assert not nsqd.running
        nsqd.start()  # same ports, same data directory: the message was flushed to disk
        channel = nsqd.channel_stats("real_helper", "c")
        topic = nsqd.topic_stats("real_helper")
        assert topic is not None and topic["depth"] + (channel or {}).get("depth", 0) >= 1


def test_missing_binaries_are_reported_not_raised(tmp_path: Path) -> None:
    assert find_binaries(str(tmp_path)) is None
    with pytest.raises(FileNotFoundError, match="no nsqd binary found"):
        RealNSQD(bin_dir=str(tmp_path))
