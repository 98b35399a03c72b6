"""The core's publish path alone: PUBs queued, written, answered; per second and per publish.

No sockets, no event loop: ``ClientConnection.publish()`` for ``--batch`` publishes, one
``data_to_send()`` (what a transport writes per loop pass), then nsqd's answers fed back with
``receive_data()`` (one ``OK`` per PUB, or one per coalesced MPUB). Run both ways:

* ``coalesce=False``: one PUB (and one answer) per publish;
* ``coalesce=True``: the PUBs of a write go out as one MPUB, still one
  ``PublishAcknowledged`` per publish.

Run: ``python bench/bench_core_publish.py [--publishes N] [--batch B] [--repeat R]``.
"""

from __future__ import annotations

import argparse
import os
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)

from nsq_sansio import ClientConnection, ConnectionState  # noqa: E402
from nsq_sansio.events import PublishAcknowledged  # noqa: E402
from nsq_sansio.frames import FrameType, encode_frame  # noqa: E402

OK = encode_frame(FrameType.RESPONSE, b"OK")


def ready() -> ClientConnection:
    conn = ClientConnection()
    conn.receive_data(OK, 0.0)  # an old-style IDENTIFY answer: READY, no features
    assert conn.state is ConnectionState.READY
    conn.data_to_send()
    return conn


def run(publishes: int, batch: int, body_size: int, coalesce: bool) -> float:
    """Seconds for ``publishes`` publishes, ``batch`` per write; checks every answer."""
    conn = ready()
    body = b"x" * body_size
    publish = conn.publish
    answers = OK if coalesce else OK * batch
    rounds = publishes // batch
    acknowledged = 0
    started = time.perf_counter()
    for _ in range(rounds):
        for _ in range(batch):
            publish("bench", body, coalesce)
        conn.data_to_send()
        events = conn.receive_data(answers)
        acknowledged += len(events)
    elapsed = time.perf_counter() - started
    assert acknowledged == rounds * batch, acknowledged
    assert all(type(e) is PublishAcknowledged for e in events)
    return elapsed


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--publishes", type=int, default=500_000)
    parser.add_argument("--batch", type=int, default=100, help="publishes per write")
    parser.add_argument("--body-size", type=int, default=100)
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    print(f"Python {sys.version.split()[0]}; {args.publishes:,} publishes, {args.batch} per write")
    for coalesce in (False, True):
        best = min(
            run(args.publishes, args.batch, args.body_size, coalesce) for _ in range(args.repeat)
        )
        rate = args.publishes / best
        print(
            f"  coalesce={coalesce!s:5}  {rate:>12,.0f} publishes/s  "
            f"{best / args.publishes * 1e6:.3f} us per publish"
        )


if __name__ == "__main__":
    main()
