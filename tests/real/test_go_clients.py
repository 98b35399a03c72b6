"""Real Go clients (NSQ v1.3.0's tools, go-nsq inside) against the embedded broker.

``to_nsq`` publishes and ``nsq_tail`` consumes through go-nsq, plain, with snappy or deflate,
and over TLS (verified against the embedded nsqd's certificate) with and without compression;
``bench_writer`` and ``bench_reader`` speak the raw protocol at full speed; ``nsq_stat`` reads
the embedded nsqd's ``/stats`` found through the embedded nsqlookupd.
"""

from __future__ import annotations

import json
import re
import subprocess
from collections.abc import Iterator
from typing import Any

import pytest
from conformance.wire import http_request, unique, wait_for
from support.brokers import require_real_binaries

from transports.embedded import Cluster, EmbeddedNSQD, ServerThread
from transports.testing.real_nsq import tool
from transports.testing.tls import self_signed_certificate

TOOL_TIMEOUT = 60


def run_tool(name: str, *args: str, stdin: bytes | None = None) -> subprocess.CompletedProcess[str]:
    path = tool(name)
    assert path is not None, f"{name} is missing from the reference binaries"
    done = subprocess.run(
        [str(path), *args],
        input=None if stdin is None else stdin.decode(),
        capture_output=True,
        text=True,
        timeout=TOOL_TIMEOUT,
    )
    assert done.returncode == 0, f"{name} exited {done.returncode}: {done.stderr[-2000:]}"
    return done


def stats(http_address: str, topic: str) -> dict[str, Any]:
    path = f"/stats?format=json&topic={topic}&include_mem=false"
    (found,) = json.loads(http_request(http_address, "GET", path)[1])["topics"]
    result: dict[str, Any] = found
    return result


@pytest.fixture(scope="module")
def tls_nsqd() -> Iterator[tuple[EmbeddedNSQD, str]]:
    """An embedded nsqd offering TLS (optional) with a throwaway certificate for 127.0.0.1."""
    require_real_binaries()
    try:
        certificate = self_signed_certificate()
        cert, key = certificate.__enter__()
    except (OSError, subprocess.CalledProcessError):
        pytest.skip("neither the cryptography package nor an openssl binary is available")
    try:
        with ServerThread(EmbeddedNSQD(tls_cert=cert, tls_key=key)) as nsqd:
            yield nsqd, cert
    finally:
        certificate.__exit__(None, None, None)


WIRE_OPTIONS = {
    "plain": [],
    "snappy": ["snappy,true"],
    "deflate": ["deflate,true", "deflate_level,5"],
    "tls": ["tls_v1,true"],
    "tls+snappy": ["tls_v1,true", "snappy,true"],
    "tls+deflate": ["tls_v1,true", "deflate,true"],
}


@pytest.mark.parametrize("wire", list(WIRE_OPTIONS))
def test_to_nsq_and_nsq_tail_round_trip(tls_nsqd: tuple[EmbeddedNSQD, str], wire: str) -> None:
    nsqd, cert = tls_nsqd
    topic = unique("go")
    options = list(WIRE_OPTIONS[wire])
    if "tls_v1,true" in options:
        options.append(f"tls_root_ca_file,{cert}")  # verified, not skipped
    lines = [f"line {i} " + "x" * (i * 7) for i in range(200)]
    published = run_tool(
        "to_nsq",
        f"--nsqd-tcp-address={nsqd.tcp_address}",
        f"--topic={topic}",
        *(f"--producer-opt={option}" for option in options),
        stdin=("\n".join(lines) + "\n").encode(),
    )
    if "tls_v1,true" in options:
        assert "upgrading to TLS" in published.stderr
    for kind in ("snappy", "deflate"):
        if kind in wire:
            assert f"upgrading to {kind.capitalize()}" in published.stderr
    assert stats(nsqd.http_address, topic)["message_count"] == len(lines)
    tailed = run_tool(
        "nsq_tail",
        f"--nsqd-tcp-address={nsqd.tcp_address}",
        f"--topic={topic}",
        "--channel=tail",
        f"-n={len(lines)}",
        *(f"--consumer-opt={option}" for option in options),
    )
    assert tailed.stdout.splitlines() == lines

    # all delivered and FIN'd but the last one or two: nsq_tail exits from its handler once it
    # has shown -n messages, before go-nsq sends their FIN (the real nsqd shows the same). The
    # FINs it sent just before it exited may not be read yet: read until they are (a message
    # never FIN'd stays in flight for the 60 s msg_timeout, and fails here)
    def channel_once_fins_read() -> dict[str, Any] | None:
        (found,) = stats(nsqd.http_address, topic)["channels"]
        return found if found["in_flight_count"] <= 2 else None

    channel = wait_for(channel_once_fins_read)
    assert channel["depth"] == 0 and channel["in_flight_count"] <= 2, channel
    assert (channel["message_count"], channel["requeue_count"]) == (len(lines), 0)


def test_bench_writer_and_bench_reader(tls_nsqd: tuple[EmbeddedNSQD, str]) -> None:
    nsqd, _ = tls_nsqd
    topic = unique("bench")
    http_request(nsqd.http_address, "POST", f"/topic/create?topic={topic}")
    http_request(nsqd.http_address, "POST", f"/channel/create?topic={topic}&channel=ch")
    writer = run_tool(
        "bench_writer",
        f"--nsqd-tcp-address={nsqd.tcp_address}",
        f"--topic={topic}",
        "--runfor=1s",
        "--size=200",
        "--batch-size=100",
    )
    rate = re.search(r"([\d.]+)ops/s", writer.stdout + writer.stderr)
    assert rate and float(rate.group(1)) > 0, writer.stdout + writer.stderr
    written = stats(nsqd.http_address, topic)["message_count"]
    assert written >= 100
    reader = run_tool(
        "bench_reader",
        f"--nsqd-tcp-address={nsqd.tcp_address}",
        f"--topic={topic}",
        "--channel=ch",
        "--runfor=1s",
        "--size=200",
    )
    rate = re.search(r"([\d.]+)ops/s", reader.stdout + reader.stderr)
    assert rate and float(rate.group(1)) > 0, reader.stdout + reader.stderr
    (channel,) = stats(nsqd.http_address, topic)["channels"]
    # every message reached the channel; what the reader took left it (FIN'd, or in flight
    # until its timeout since the reader quit holding RDY)
    assert channel["message_count"] == written
    assert channel["depth"] < written


def test_nsq_stat_reads_the_embedded_cluster_through_lookupd() -> None:
    require_real_binaries()
    topic = unique("stat")
    with ServerThread(Cluster(nsqd_count=2)) as cluster:
        assert cluster.lookupd is not None
        for index, nsqd in enumerate(cluster.nsqds):
            body = b"\n".join(b"m%d" % i for i in range(3 + index))
            assert http_request(nsqd.http_address, "POST", f"/mpub?topic={topic}", body)[0] == 200
            http_request(nsqd.http_address, "POST", f"/channel/create?topic={topic}&channel=c")
        cluster.wait_registered_blocking(topic)
        shown = run_tool(
            "nsq_stat",
            f"--lookupd-http-address={cluster.lookupd.http_address}",
            f"--topic={topic}",
            "--channel=c",
            "--count=1",
            "--interval=100ms",
        )
    lines = shown.stdout.strip().splitlines()
    assert "depth" in lines[0] and "total" in lines[1]
    columns = lines[2].replace("|", " ").split()
    # ingress egress | total mem disk inflt def | req t-o msgs clients
    assert columns[2:4] == ["7", "7"]  # the channel's depth summed over both nsqd: 3 + 4
    assert columns[-2:] == ["7", "0"]
