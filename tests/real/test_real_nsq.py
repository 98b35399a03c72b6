"""The helper that runs the real NSQ binaries: finds them, starts nsqd + nsqlookupd, stops them.

Skipped where the binaries are absent (a user's clone has no ``../shared``).
"""

from __future__ import annotations

import socket
import ssl
import time
import urllib.request
from pathlib import Path

import pytest
from sync.conftest import test_ca  # noqa: F401 (the fixture, as in tests/sync)

from transports.sync import Consumer
from transports.testing import real_nsq
from transports.testing.real_nsq import (
    MISSING_BINARIES,
    RealLookupd,
    RealNSQD,
    find_binaries,
    free_port,
)

pytestmark = pytest.mark.skipif(find_binaries() is None, reason=MISSING_BINARIES)


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
        # Exactly one: nobody consumed it, so nothing was delivered twice; the depths are read
        # once nsqd's pump has moved it from the topic into the channel (while it moves, the
        # two depths can count it twice or not at all, so a single read proves nothing).
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            channel = nsqd.channel_stats("real_helper", "c") or {}
            topic = nsqd.topic_stats("real_helper") or {}
            if (topic.get("depth"), channel.get("depth")) == (0, 1):
                break
            time.sleep(0.05)
        assert (topic.get("depth"), channel.get("depth")) == (0, 1), (topic, channel)
        with Consumer("real_helper", "c", nsqd=[nsqd.tcp_address]) as consumer:
            kept = consumer.get(timeout=10)
            assert kept is not None and kept.body == b"hello" and kept.attempts == 1
            kept.finish()
            assert consumer.get(timeout=0.5) is None  # and nothing else came back


def test_missing_binaries_are_reported_not_raised(tmp_path: Path) -> None:
    assert find_binaries(str(tmp_path)) is None
    with pytest.raises(FileNotFoundError, match="no nsqd binary found"):
        RealNSQD(bin_dir=str(tmp_path))


@pytest.mark.parametrize("server", [RealNSQD, RealLookupd])
def test_a_port_taken_between_its_pick_and_the_start_is_picked_again(
    server: type[RealNSQD | RealLookupd], monkeypatch: pytest.MonkeyPatch
) -> None:
    # another test process (a parallel run) can take a port after free_port() saw it free
    with socket.socket() as blocker:
        blocker.bind(("127.0.0.1", 0))
        blocker.listen()
        taken = blocker.getsockname()[1]
        picks = iter([taken, taken])
        monkeypatch.setattr(real_nsq, "free_port", lambda: next(picks, None) or free_port())
        with server() as started:
            assert taken not in (started.tcp_port, started.http_port)
            assert started.get("/ping") == b"OK"
            port = started.tcp_port
            started.stop()
            started.start()  # a restart keeps its ports
            assert started.tcp_port == port


def test_two_tls_nsqds_run_side_by_side_each_on_its_own_https_port(
    test_ca: dict[str, str],  # noqa: F811
) -> None:
    # with a certificate nsqd also opens HTTPS, on the fixed 0.0.0.0:4152 unless told
    # otherwise, so a second TLS nsqd (a parallel test) failed at start; each gets a port now
    ssl_context = ssl.create_default_context(cafile=test_ca["ca"])
    tls = [f"--tls-cert={test_ca['cert']}", f"--tls-key={test_ca['key']}"]
    with RealNSQD(tls) as first, RealNSQD(tls) as second:
        assert first.https_port != second.https_port
        for nsqd in (first, second):
            with urllib.request.urlopen(
                f"https://{nsqd.https_address}/ping", context=ssl_context, timeout=5
            ) as answer:
                assert answer.read() == b"OK"
