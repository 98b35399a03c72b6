"""Consumer coordinator benchmark: messages through 4 connections with RDY bookkeeping,
against one bare ClientConnection (bench_core.py's single-connection figure).

Both get the same pre-built message frames (100-byte bodies) in 64 KiB chunks; every message is
answered with FIN and the FIN bytes are collected once per chunk. No sockets, no event loop.

* single connection: ``ClientConnection.receive_data`` -> ``Message``, ``finish(id)``,
  ``data_to_send()`` (exactly bench_core.py's nsq_sansio line).
* coordinator, 4 connections: the chunks are dealt round-robin to 4 subscribed connections;
  ``ConsumerCoordinator.receive_data`` -> ``Deliver`` actions (attempts check, deadline,
  in-flight record, RDY refresh at 25%), ``finish(deliver)`` (backoff bookkeeping), then
  ``pending_data()`` once per chunk.
* the same, answered in one ``finish_many(deliveries)`` call per read (what a transport that
  collects its users' answers, like the blocking one, can do): same checks, same FIN bytes.

Run: ``python bench/bench_coordinator.py [--messages N] [--repeat R]``. Prints msgs/s (of CPU time)
for each and the slowdown single / coordinator (target: <= 1.5x).
"""

from __future__ import annotations

import argparse
import gc
import os
import platform
import random
import sys
import time
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from nsq_sansio import ClientConnection, ConnectionState, Message
from nsq_sansio.config import Config
from nsq_sansio.consumer import Connect, ConsumerCoordinator, Deliver
from nsq_sansio.frames import encode_frame, encode_message_frame

CHUNK = 64 * 1024
CONNECTIONS = 4


def build_chunks(count: int, body_size: int) -> list[bytes]:
    """``count`` message frames as nsqd sends them, cut in 64 KiB chunks (frames whole)."""
    body = os.urandom(body_size)
    chunks: list[bytes] = []
    current: list[bytes] = []
    size = 0
    for index in range(count):
        frame = encode_message_frame(b"%016x" % index, 1_700_000_000_000_000_000, 1, body)
        if size + len(frame) > CHUNK and current:
            chunks.append(b"".join(current))
            current, size = [], 0
        current.append(frame)
        size += len(frame)
    if current:
        chunks.append(b"".join(current))
    return chunks


def run_single(chunks: list[bytes], out: list[bytes] | None = None) -> int:
    conn = ClientConnection({"heartbeat_interval": -1})
    conn.receive_data(encode_frame(0, b'{"max_rdy_count": 2500}'))
    conn.subscribe("bench", "bench")
    conn.receive_data(encode_frame(0, b"OK"))
    conn.send_ready(2500)
    conn.data_to_send()
    assert conn.state is ConnectionState.SUBSCRIBED
    receive, finish, flush = conn.receive_data, conn.finish, conn.data_to_send
    count = 0
    for chunk in chunks:
        for event in receive(chunk):
            if type(event) is Message:
                finish(event.id)
                count += 1
        data = flush()
        if out is not None:
            out.append(data)
    return count


def subscribed_coordinator() -> tuple[ConsumerCoordinator, list[int]]:
    nodes = [f"10.0.0.{i}:4150" for i in range(1, CONNECTIONS + 1)]
    config = Config(max_in_flight=CONNECTIONS * 2500, heartbeat_interval=30.0)
    c = ConsumerCoordinator("bench", "bench", config, rng=random.Random(1), nsqd=nodes)
    c.start(0.0)
    ids = [a.conn_id for a in c.take_actions() if isinstance(a, Connect)]
    for conn_id in ids:
        c.connection_made(conn_id, 0.0)
        c.receive_data(conn_id, encode_frame(0, b'{"max_rdy_count": 2500}'), 0.0)
        c.receive_data(conn_id, encode_frame(0, b"OK"), 0.0)
    for conn_id in ids:  # warmed up as the periodic check does: RDY 2500 each before the
        c._links[conn_id].warm = True  # reads below (an nsqd sends no more than RDY allows)
    c._rdy.rebalance(0.0)
    c.pending_data()
    c.take_actions()
    assert len(c.connection_ids()) == CONNECTIONS
    return c, ids


def run_coordinator(chunks: list[bytes], out: list[bytes] | None = None) -> int:
    c, ids = subscribed_coordinator()
    receive, finish, take, flush = c.receive_data, c.finish, c.take_actions, c.pending_data
    count = 0
    now = 1.0
    for index, chunk in enumerate(chunks):
        receive(ids[index % CONNECTIONS], chunk, now)
        for action in take():
            if type(action) is Deliver:
                finish(action, now)
                count += 1
        written = flush()
        if out is not None:
            out.extend(data for _, data in written)
    take()
    assert c.total_rdy <= c.max_in_flight
    assert c.in_flight_count() == 0 and c.stats["finished"] == count
    return count


def run_coordinator_batched(chunks: list[bytes], out: list[bytes] | None = None) -> int:
    """The same, answered the way a transport that collects its users' answers can:
    the Deliver actions of a read handed back in one ``finish_many`` call."""
    c, ids = subscribed_coordinator()
    receive, finish_many = c.receive_data, c.finish_many
    take, flush = c.take_actions, c.pending_data
    count = 0
    now = 1.0
    for index, chunk in enumerate(chunks):
        receive(ids[index % CONNECTIONS], chunk, now)
        count += finish_many([action for action in take() if type(action) is Deliver], now)
        written = flush()
        if out is not None:
            out.extend(data for _, data in written)
    take()
    assert c.total_rdy <= c.max_in_flight
    assert c.in_flight_count() == 0 and c.stats["finished"] == count
    return count


def fins(written: list[bytes]) -> list[bytes]:
    """The ids of every FIN line written, sorted."""
    lines = b"".join(written).split(b"\n")
    return sorted(line[4:] for line in lines if line.startswith(b"FIN "))


def measure(fn: Callable[[list[bytes]], int], chunks: list[bytes]) -> float:
    """Messages per second of CPU time (process time: steadier than wall time on a machine
    shared with other jobs; no IO happens here, so the two only differ by preemption)."""
    gc.collect()
    start = time.process_time()
    count = fn(chunks)
    return count / max(time.process_time() - start, 1e-9)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--messages", type=int, default=200_000)
    parser.add_argument("--body-size", type=int, default=100)
    parser.add_argument("--repeat", type=int, default=15)
    args = parser.parse_args()
    chunks = build_chunks(args.messages, args.body_size)
    runners = {
        "single ClientConnection": run_single,
        f"coordinator, {CONNECTIONS} connections, finish()": run_coordinator,
        f"coordinator, {CONNECTIONS} connections, finish_many()": run_coordinator_batched,
    }
    expected = [b"%016x" % index for index in range(args.messages)]
    for name, fn in runners.items():  # same work: every message FIN'd once, on the wire
        written: list[bytes] = []
        assert fn(chunks, written) == args.messages, f"{name} lost messages"
        assert fins(written) == expected, f"{name} wrote the wrong FINs"
    best = dict.fromkeys(runners, 0.0)
    for _ in range(args.repeat):  # interleaved, best of N
        for name, fn in runners.items():
            best[name] = max(best[name], measure(fn, chunks))
    print(
        f"{args.messages} messages, {args.body_size}-byte bodies, {len(chunks)} chunks; "
        f"best of {args.repeat}; Python {platform.python_version()}"
    )
    width = max(map(len, runners))
    for name, rate in best.items():
        print(f"  {name:<{width}}  {rate:>12,.0f} msgs/s")
    single, one_by_one, batched = best.values()
    print(
        f"slowdown coordinator / single: finish() {single / one_by_one:.2f}x, "
        f"finish_many() {single / batched:.2f}x (target <= 1.5x)"
    )


if __name__ == "__main__":
    main()
