"""Clients against the real nsqd v1.3.0: nsq-sansio, its Python peers and Go's ceiling.

Every measurement starts a fresh real nsqd (``transports.testing.real_nsq.RealNSQD``) and runs one
client in its own process. Before a rate is printed, nsqd's ``/stats`` must show that every
message arrived (publish rows: the topic's ``message_count``) or was delivered and FIN'd
(consume rows: channel depth, in-flight, requeue and timeout counts all 0). One command prints
the whole table (markdown) with the ratios the issue asks for, all measured in the same run::

    python bench/bench_real.py                      # everything: about 10 minutes
    python bench/bench_real.py --only consume       # consume rows only (or: publish, pub1,
    python bench/bench_real.py --only pub100 mpub   #   pub100, mpub, or parts of row names)
    python bench/bench_real.py -n 50000 --repeat 3  # smaller runs, best of 3 per row

Rows (100-byte bodies by default):

* ``consume``: ``async for`` / ``for msg in c`` and ``run(handler)`` of nsq-sansio (asyncio,
  trio, blocking), asyncnsq, pynsq and gnsq, with max_in_flight 2500 (bench_reader's RDY),
  and Go's ``bench_reader``. The rate is over the middle 80% of the messages (from the 10%
  mark to the 90% mark): start-up is excluded, and so is the tail, where nsqd holds a
  client's last partial output buffer for its 250 ms output_buffer_timeout. A Python client
  times itself; ``bench_reader`` only runs for a fixed time and divides by it, so it is timed
  here from nsqd's stats (channel depth polled every 2 ms).
* ``pub1``: ``PUB`` one by one, each awaited; plus a bare blocking socket doing PUB -> OK in a
  loop (the physical ceiling for a client that waits for each answer).
* ``pub100``: ``PUB`` from 100 concurrent callers (tasks; threads for the blocking producer;
  greenlets for gnsq; 100 outstanding callbacks for pynsq), and the blocking producer's
  ``publish_async`` from one thread with 100 in flight; the same with
  ``connections_per_nsqd=2``. Three ceilings: a bare socket writing 100 PUBs at once then
  reading their answers; the same over two connections (50 each, a thread per connection);
  and 100 threads sharing one bare socket the cheapest way (a waiting thread reads for all,
  wakes the others: what any client made of OS threads pays).
* ``mpub``: ``MPUB`` of 200 bodies, one at a time; Go's ``bench_writer`` (batch 200) as the
  ceiling.

Each row also shows nsqd's own CPU time per message (user + system, read from ``/proc`` around
the measurement) and how busy that kept one core at the row's rate: near 100%, nsqd itself, not
the client, is what limits the row.

nsqd runs with ``--mem-queue-size`` above the message count, so every message stays in memory
and the clients, not nsqd's disk queue, are what is measured. Peers install with
``pip install -e '.[bench]'``; a peer that does not import is reported as skipped. Without the
nsqd binaries (``--nsqd-bin``, ``$NSQ_BIN_DIR`` or ``../shared/reference/nsq-1.3.0``) the script
says so and exits 0.
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import re
import resource
import socket
import struct
import subprocess
import sys
import time
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)

TOPIC = "bench"
CHANNEL = "bench"
MAX_IN_FLIGHT = 2500


# --- what a child process gets and returns ------------------------------------------------


@dataclass
class Job:
    """One measurement as the child process sees it."""

    address: str
    count: int
    body: bytes
    concurrency: int
    batch: int
    max_in_flight: int
    run_concurrency: int | None
    threads: int


@dataclass
class Timing:
    """What a runner measured: ``count`` messages between ``t0`` and ``t1`` (perf_counter)."""

    t0: float
    t1: float
    count: int
    extra: dict[str, Any] = field(default_factory=dict)


Runner = Callable[[Job], Timing]


@dataclass(frozen=True)
class Row:
    group: str  # consume, pub1, pub100, mpub
    key: str  # unique: group/client
    label: str
    runner: str | None  # a registered child runner; None for the Go tools


RUNNERS: dict[str, Runner] = {}
ROWS: list[Row] = []


def row(group: str, client: str, label: str) -> Callable[[Runner], Runner]:
    """Register ``func`` as the child runner of row ``group/client``."""

    def register(func: Runner) -> Runner:
        key = f"{group}/{client}"
        RUNNERS[key] = func
        ROWS.append(Row(group, key, label, key))
        return func

    return register


class Counter:
    """Counts handled messages; times the middle 80% (start-up and the tail excluded).

    The tail matters: nsqd flushes a client's last partial output buffer only after its
    output_buffer_timeout (250 ms by default), which would swamp the rate of a short run.
    """

    __slots__ = ("count", "left", "mark0", "mark1", "t0", "t1")

    def __init__(self, count: int) -> None:
        self.count = count
        self.left = count
        edge = count // 10
        self.mark0 = count - edge  # ``left`` when the timed part starts
        self.mark1 = edge  # ``left`` when it ends
        self.t0 = 0.0
        self.t1 = 0.0

    def hit(self) -> bool:
        """One message handled; True when it was the last one."""
        left = self.left - 1
        self.left = left
        if left == self.mark0:
            self.t0 = time.perf_counter()
        if left == self.mark1:
            self.t1 = time.perf_counter()
        return left == 0

    def timing(self) -> Timing:
        return Timing(self.t0, self.t1, self.mark0 - self.mark1)


# --- consume: nsq-sansio ------------------------------------------------------------------


def _anyio_iter(backend: str) -> Runner:
    def run(job: Job) -> Timing:
        import anyio

        from transports.anyio import Consumer

        counter = Counter(job.count)

        async def main() -> None:
            async with Consumer(
                TOPIC, CHANNEL, nsqd=[job.address], max_in_flight=job.max_in_flight
            ) as c:
                hit = counter.hit
                async for msg in c:
                    msg.finish_nowait()
                    if hit():
                        break

        anyio.run(main, backend=backend)
        return counter.timing()

    return run


def _anyio_run(backend: str) -> Runner:
    def run(job: Job) -> Timing:
        import anyio

        from transports.anyio import Consumer

        counter = Counter(job.count)

        async def main() -> None:
            async with (
                Consumer(TOPIC, CHANNEL, nsqd=[job.address], max_in_flight=job.max_in_flight) as c,
                anyio.create_task_group() as tg,
            ):
                hit = counter.hit

                async def handler(msg: object) -> None:
                    if hit():
                        # Every message is in user code or answered: drain (run() returns).
                        tg.start_soon(c.drain, 10.0)

                await c.run(handler, concurrency=job.run_concurrency)

        anyio.run(main, backend=backend)
        return counter.timing()

    return run


row("consume", "sansio-asyncio-iter", "nsq-sansio asyncio, `async for`")(_anyio_iter("asyncio"))
row("consume", "sansio-trio-iter", "nsq-sansio trio, `async for`")(_anyio_iter("trio"))
row("consume", "sansio-asyncio-run", "nsq-sansio asyncio, `run(handler)`")(_anyio_run("asyncio"))
row("consume", "sansio-trio-run", "nsq-sansio trio, `run(handler)`")(_anyio_run("trio"))


@row("consume", "sansio-blocking-iter", "nsq-sansio blocking, `for msg in c`")
def _blocking_iter(job: Job) -> Timing:
    from transports.sync import Consumer

    counter = Counter(job.count)
    with Consumer(TOPIC, CHANNEL, nsqd=[job.address], max_in_flight=job.max_in_flight) as c:
        hit = counter.hit
        for msg in c:
            msg.finish()
            if hit():
                break
    return counter.timing()


@row("consume", "sansio-blocking-run", "nsq-sansio blocking, `run(handler, concurrency=8)`")
def _blocking_run(job: Job) -> Timing:
    import threading

    from transports.sync import Consumer

    counter = Counter(job.count)
    lock = threading.Lock()
    with Consumer(TOPIC, CHANNEL, nsqd=[job.address], max_in_flight=job.max_in_flight) as c:
        hit = counter.hit

        def handler(msg: object) -> None:
            with lock:
                if hit():
                    c.start_drain(10.0)

        c.run(handler, concurrency=job.threads)
    return counter.timing()


# --- consume: peers -----------------------------------------------------------------------


@row("consume", "asyncnsq", "asyncnsq 1.2.1")
def _asyncnsq_consume(job: Job) -> Timing:
    import asyncio
    import logging

    from asyncnsq import create_reader

    logging.getLogger("asyncnsq").setLevel(logging.ERROR)
    counter = Counter(job.count)

    async def main() -> None:
        reader = await create_reader(
            nsqd_tcp_addresses=[job.address], max_in_flight=job.max_in_flight
        )
        await reader.subscribe(TOPIC, CHANNEL)
        hit = counter.hit
        async for msg in reader.messages():
            await msg.fin()
            if hit():
                break
        await asyncio.sleep(0.05)  # let the last FINs leave (asyncnsq writes in the background)
        reader.close()

    asyncio.run(main())
    return counter.timing()


@row("consume", "pynsq", "pynsq 0.9.1")
def _pynsq_consume(job: Job) -> Timing:
    import logging

    import nsq
    import tornado.ioloop

    logging.getLogger("nsq").setLevel(logging.ERROR)
    loop = tornado.ioloop.IOLoop.current()
    counter = Counter(job.count)
    hit = counter.hit

    def handler(message: Any) -> bool:
        if hit():
            loop.call_later(0.05, loop.stop)  # the FIN of this one is written on return
        return True

    reader = nsq.Reader(
        topic=TOPIC,
        channel=CHANNEL,
        nsqd_tcp_addresses=[job.address],
        message_handler=handler,
        max_in_flight=job.max_in_flight,
    )
    loop.start()
    reader.close()
    return counter.timing()


@row("consume", "gnsq", "gnsq 1.0.2")
def _gnsq_consume(job: Job) -> Timing:
    import logging

    import gevent
    import gnsq

    logging.getLogger("gnsq").setLevel(logging.ERROR)
    counter = Counter(job.count)
    consumer = gnsq.Consumer(
        TOPIC, CHANNEL, nsqd_tcp_addresses=[job.address], max_in_flight=job.max_in_flight
    )
    hit = counter.hit

    @consumer.on_message.connect
    def handler(consumer: Any, message: Any) -> None:
        if hit():
            gevent.spawn_later(0.05, consumer.close)  # after this message's FIN

    consumer.start(block=True)
    return counter.timing()


# --- publishing: one warm-up outside the timed part, then a timed loop -----------------------

#: A timed publishing loop: publishes with the producer/writer, returns how many messages.
AsyncLoop = Callable[[Any, Job], Awaitable[int]]
Loop = Callable[[Any, Job], int]


def _anyio_publisher(backend: str, loop: AsyncLoop, connections: int = 1) -> Runner:
    """A runner timing ``loop`` with an anyio Producer on ``backend``."""

    def run(job: Job) -> Timing:
        import anyio

        from transports.anyio import Producer

        timing: list[float] = []
        counted: list[int] = []

        async def main() -> None:
            async with Producer(job.address, connections_per_nsqd=connections) as p:
                await p.publish("warmup", b"x")  # connect outside the timed part
                timing.append(time.perf_counter())
                counted.append(await loop(p, job))
                timing.append(time.perf_counter())

        anyio.run(main, backend=backend)
        return Timing(timing[0], timing[1], counted[0])

    return run


def _blocking_publisher(loop: Loop, connections: int = 1) -> Runner:
    """A runner timing ``loop`` with a blocking Producer."""

    def run(job: Job) -> Timing:
        from transports.sync import Producer

        with Producer(job.address, connections_per_nsqd=connections) as p:
            p.publish("warmup", b"x")
            t0 = time.perf_counter()
            count = loop(p, job)
            t1 = time.perf_counter()
        return Timing(t0, t1, count)

    return run


def _asyncnsq_publisher(loop: AsyncLoop) -> Runner:
    """A runner timing ``loop`` with an asyncnsq writer."""

    def run(job: Job) -> Timing:
        import asyncio

        from asyncnsq import create_writer

        timing: list[float] = []
        counted: list[int] = []

        async def main() -> None:
            host, _, port = job.address.rpartition(":")
            writer = await create_writer(host=host, port=int(port))
            await writer.pub("warmup", b"x")
            timing.append(time.perf_counter())
            counted.append(await loop(writer, job))
            timing.append(time.perf_counter())
            writer.close()

        asyncio.run(main())
        return Timing(timing[0], timing[1], counted[0])

    return run


# --- pub1: one publish at a time ------------------------------------------------------------


async def _pub1_async(p: Any, job: Job) -> int:
    """``await p.publish`` one by one (an anyio Producer)."""
    publish, body = p.publish, job.body
    for _ in range(job.count):
        await publish(TOPIC, body)
    return job.count


def _pub1_blocking(p: Any, job: Job) -> int:
    publish, body = p.publish, job.body
    for _ in range(job.count):
        publish(TOPIC, body)
    return job.count


async def _pub1_asyncnsq(writer: Any, job: Job) -> int:
    pub, body = writer.pub, job.body
    for _ in range(job.count):
        await pub(TOPIC, body)
    return job.count


row("pub1", "sansio-asyncio", "nsq-sansio asyncio")(_anyio_publisher("asyncio", _pub1_async))
row("pub1", "sansio-trio", "nsq-sansio trio")(_anyio_publisher("trio", _pub1_async))
row("pub1", "sansio-blocking", "nsq-sansio blocking")(_blocking_publisher(_pub1_blocking))
row("pub1", "asyncnsq", "asyncnsq 1.2.1")(_asyncnsq_publisher(_pub1_asyncnsq))


def _pynsq_publish(job: Job, callers: int, batch: int) -> Timing:
    """``callers`` chains of pynsq publishes (callback -> next publish); MPUB when batch > 1."""
    import logging

    import nsq
    import tornado.ioloop

    logging.getLogger("nsq").setLevel(logging.ERROR)
    loop = tornado.ioloop.IOLoop.current()
    writer = nsq.Writer([job.address])
    sends = job.count // batch
    state = {"started": 0, "done": 0, "t0": 0.0, "t1": 0.0, "error": ""}
    payload: Any = [job.body] * batch if batch > 1 else job.body
    send = writer.mpub if batch > 1 else writer.pub

    def next_send() -> None:
        if state["started"] < sends:
            state["started"] += 1
            send(TOPIC, payload, callback=answered)

    def answered(conn: Any, data: Any) -> None:
        if isinstance(data, nsq.Error):
            state["error"] = str(data)
            loop.stop()
            return
        state["done"] += 1
        if state["done"] == sends:
            state["t1"] = time.perf_counter()
            loop.stop()
        else:
            next_send()

    def start() -> None:
        if not writer.conns or not any(c.connected() for c in writer.conns.values()):
            loop.call_later(0.01, start)
            return
        state["t0"] = time.perf_counter()
        for _ in range(callers):
            next_send()

    loop.call_later(0.01, start)
    loop.start()
    if state["error"]:
        raise RuntimeError(f"pynsq publish failed: {state['error']}")
    return Timing(state["t0"], state["t1"], sends * batch)


row("pub1", "pynsq", "pynsq 0.9.1")(lambda job: _pynsq_publish(job, 1, 1))


@row("pub1", "gnsq", "gnsq 1.0.2")
def _gnsq_pub1(job: Job) -> Timing:
    import gnsq

    producer = gnsq.Producer([job.address])
    producer.start()
    producer.publish("warmup", b"x")
    publish, body = producer.publish, job.body
    t0 = time.perf_counter()
    for _ in range(job.count):
        publish(TOPIC, body)
    t1 = time.perf_counter()
    producer.close()
    return Timing(t0, t1, job.count)


@row("pub1", "bare-socket", "bare blocking socket, PUB -> OK (ceiling)")
def _bare_pub1(job: Job) -> Timing:
    host, _, port = job.address.rpartition(":")
    sock = socket.create_connection((host, int(port)))
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    sock.sendall(b"  V2")
    command = b"PUB " + TOPIC.encode() + b"\n" + struct.pack(">I", len(job.body)) + job.body
    ok = struct.pack(">ii", 6, 0) + b"OK"
    send, recv = sock.sendall, sock.recv
    t0 = time.perf_counter()
    for _ in range(job.count):
        send(command)
        answer = recv(64)
        while len(answer) < 10:
            answer += recv(64)
        if answer != ok:
            raise RuntimeError(f"nsqd answered {answer!r}")
    t1 = time.perf_counter()
    sock.close()
    return Timing(t0, t1, job.count)


# --- pub100: concurrent callers -------------------------------------------------------------


async def _concurrent_tasks(p: Any, job: Job) -> int:
    """``job.concurrency`` tasks publishing their share one by one (an anyio Producer)."""
    import anyio

    publish, body = p.publish, job.body
    share, extra = divmod(job.count, job.concurrency)

    async def caller(n: int) -> None:
        for _ in range(n):
            await publish(TOPIC, body)

    async with anyio.create_task_group() as tg:
        for i in range(job.concurrency):
            tg.start_soon(caller, share + (i < extra))
    return job.count


def _anyio_concurrent(backend: str, connections: int = 1) -> Runner:
    return _anyio_publisher(backend, _concurrent_tasks, connections)


row("pub100", "sansio-asyncio", "nsq-sansio asyncio, tasks")(_anyio_concurrent("asyncio"))
row("pub100", "sansio-trio", "nsq-sansio trio, tasks")(_anyio_concurrent("trio"))


def _blocking_threads(job: Job, connections: int) -> Timing:
    import threading

    from transports.sync import Producer

    with Producer(job.address, connections_per_nsqd=connections) as p:
        p.publish("warmup", b"x")
        publish, body = p.publish, job.body
        share, extra = divmod(job.count, job.concurrency)
        go = threading.Event()

        def caller(n: int) -> None:
            go.wait()
            for _ in range(n):
                publish(TOPIC, body)

        threads = [
            threading.Thread(target=caller, args=(share + (i < extra),))
            for i in range(job.concurrency)
        ]
        for t in threads:
            t.start()
        t0 = time.perf_counter()
        go.set()
        for t in threads:
            t.join()
        t1 = time.perf_counter()
    return Timing(t0, t1, job.count)


def _blocking_pipelined(job: Job, connections: int) -> Timing:
    from collections import deque

    from transports.sync import Producer

    with Producer(job.address, connections_per_nsqd=connections) as p:
        p.publish("warmup", b"x")
        publish, body = p.publish_async, job.body
        window: deque[Any] = deque()
        limit = job.concurrency
        t0 = time.perf_counter()
        for _ in range(job.count):
            window.append(publish(TOPIC, body))
            if len(window) >= limit:
                window.popleft().result()
        while window:
            window.popleft().result()
        t1 = time.perf_counter()
    return Timing(t0, t1, job.count)


row("pub100", "sansio-blocking-threads", "nsq-sansio blocking, threads")(
    lambda job: _blocking_threads(job, 1)
)
row("pub100", "sansio-blocking-async", "nsq-sansio blocking, `publish_async` from one thread")(
    lambda job: _blocking_pipelined(job, 1)
)
row("pub100", "sansio-asyncio-pool2", "nsq-sansio asyncio, tasks, `connections_per_nsqd=2`")(
    _anyio_concurrent("asyncio", 2)
)
row("pub100", "sansio-trio-pool2", "nsq-sansio trio, tasks, `connections_per_nsqd=2`")(
    _anyio_concurrent("trio", 2)
)
row(
    "pub100",
    "sansio-blocking-threads-pool2",
    "nsq-sansio blocking, threads, `connections_per_nsqd=2`",
)(lambda job: _blocking_threads(job, 2))
row(
    "pub100",
    "sansio-blocking-async-pool2",
    "nsq-sansio blocking, `publish_async`, `connections_per_nsqd=2`",
)(lambda job: _blocking_pipelined(job, 2))


@row("pub100", "asyncnsq", "asyncnsq 1.2.1, tasks")
def _asyncnsq_concurrent(job: Job) -> Timing:
    import asyncio

    from asyncnsq import create_writer

    timing: list[float] = []

    async def main() -> None:
        host, _, port = job.address.rpartition(":")
        writer = await create_writer(host=host, port=int(port))
        await writer.pub("warmup", b"x")
        pub, body = writer.pub, job.body
        share, extra = divmod(job.count, job.concurrency)

        async def caller(n: int) -> None:
            for _ in range(n):
                await pub(TOPIC, body)

        timing.append(time.perf_counter())
        await asyncio.gather(*(caller(share + (i < extra)) for i in range(job.concurrency)))
        timing.append(time.perf_counter())
        writer.close()

    asyncio.run(main())
    return Timing(timing[0], timing[1], job.count)


row("pub100", "pynsq", "pynsq 0.9.1, callbacks")(
    lambda job: _pynsq_publish(job, job.concurrency, 1)
)


@row("pub100", "gnsq", "gnsq 1.0.2, greenlets")
def _gnsq_concurrent(job: Job) -> Timing:
    import gevent
    import gnsq

    producer = gnsq.Producer([job.address])
    producer.start()
    producer.publish("warmup", b"x")
    publish, body = producer.publish, job.body
    share, extra = divmod(job.count, job.concurrency)

    def caller(n: int) -> None:
        for _ in range(n):
            publish(TOPIC, body)

    t0 = time.perf_counter()
    gevent.joinall(
        [gevent.spawn(caller, share + (i < extra)) for i in range(job.concurrency)],
        raise_error=True,
    )
    t1 = time.perf_counter()
    producer.close()
    return Timing(t0, t1, job.count)


def _bare_connection(address: str) -> socket.socket:
    host, _, port = address.rpartition(":")
    sock = socket.create_connection((host, int(port)))
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    sock.sendall(b"  V2")
    return sock


def _bare_rounds(sock: socket.socket, command: bytes, window: int, rounds: int) -> None:
    """``rounds`` times: write ``window`` commands at once, then read their answers."""
    batch = command * window
    answers = 10 * window
    for _ in range(rounds):
        sock.sendall(batch)
        got = 0
        while got < answers:
            chunk = sock.recv(65536)
            if not chunk:
                raise RuntimeError("nsqd closed the connection")
            got += len(chunk)


@row("pub100", "bare-socket", "bare socket, batches of PUBs pipelined (ceiling)")
def _bare_pipelined(job: Job) -> Timing:
    """``concurrency`` PUBs written at once, then their answers read: what nsqd does with
    that many in flight on one connection, with almost no client work."""
    sock = _bare_connection(job.address)
    command = b"PUB " + TOPIC.encode() + b"\n" + struct.pack(">I", len(job.body)) + job.body
    window = job.concurrency
    rounds = job.count // window
    t0 = time.perf_counter()
    _bare_rounds(sock, command, window, rounds)
    t1 = time.perf_counter()
    sock.close()
    return Timing(t0, t1, rounds * window)


@row("pub100", "bare-socket-2", "bare sockets, 2 connections, batches pipelined (ceiling)")
def _bare_pipelined_two(job: Job) -> Timing:
    """The same ``concurrency`` in flight, split over two connections (a thread each; the
    socket calls release the GIL): what a second connection to one nsqd buys."""
    import threading

    command = b"PUB " + TOPIC.encode() + b"\n" + struct.pack(">I", len(job.body)) + job.body
    window = max(job.concurrency // 2, 1)
    rounds = job.count // (2 * window)
    socks = [_bare_connection(job.address) for _ in range(2)]
    threads = [
        threading.Thread(target=_bare_rounds, args=(sock, command, window, rounds))
        for sock in socks
    ]
    t0 = time.perf_counter()
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    t1 = time.perf_counter()
    for sock in socks:
        sock.close()
    return Timing(t0, t1, 2 * rounds * window)


@row("pub100", "bare-threads", "bare socket shared by 100 threads (ceiling for threads)")
def _bare_threads(job: Job) -> Timing:
    """``concurrency`` threads publishing one by one over one bare socket, as cheaply as
    threads can: a thread queues its PUB; one waiting thread at a time writes what was
    queued, reads the answers and wakes their threads (a lock each), then hands the reading
    to the oldest waiting thread. No parsing beyond counting 10-byte answers: the cost of
    OS threads and the GIL, which any threaded client pays."""
    import threading
    from collections import deque

    sock = _bare_connection(job.address)
    command = b"PUB " + TOPIC.encode() + b"\n" + struct.pack(">I", len(job.body)) + job.body
    lock = threading.Lock()
    waiting: deque[Any] = deque()  # each publish's lock, in the order sent
    queued: list[bytes] = []
    state: dict[str, Any] = {"reader": None, "rest": 0}

    def publish() -> None:
        mine = threading.Lock()
        mine.acquire()
        with lock:
            waiting.append(mine)
            queued.append(command)
            lead = state["reader"] is None
            if lead:
                state["reader"] = mine
        if not lead:
            mine.acquire()  # answered, or handed the reading
            with lock:
                if state["reader"] is not mine:
                    return
        while True:
            with lock:
                out = b"".join(queued)
                queued.clear()
            if out:
                sock.sendall(out)
            data = sock.recv(65536)
            if not data:
                raise RuntimeError("nsqd closed the connection")
            total = state["rest"] + len(data)
            answers, state["rest"] = divmod(total, 10)
            done = False
            with lock:
                for _ in range(answers):
                    answered = waiting.popleft()
                    if answered is mine:
                        done = True
                    else:
                        answered.release()
                if done:
                    state["reader"] = waiting[0] if waiting else None
                    if waiting:
                        waiting[0].release()  # its thread reads next
                    return

    share = job.count // job.concurrency
    go = threading.Event()

    def caller() -> None:
        go.wait()
        for _ in range(share):
            publish()

    threads = [threading.Thread(target=caller) for _ in range(job.concurrency)]
    for thread in threads:
        thread.start()
    t0 = time.perf_counter()
    go.set()
    for thread in threads:
        thread.join()
    t1 = time.perf_counter()
    sock.close()
    return Timing(t0, t1, share * job.concurrency)


# --- mpub: MPUB of `batch` bodies, one at a time --------------------------------------------


async def _mpub_async(p: Any, job: Job) -> int:
    bodies = [job.body] * job.batch
    mpub = p.multi_publish
    for _ in range(job.count // job.batch):
        await mpub(TOPIC, bodies)
    return job.count // job.batch * job.batch


def _mpub_blocking(p: Any, job: Job) -> int:
    bodies = [job.body] * job.batch
    mpub = p.multi_publish
    for _ in range(job.count // job.batch):
        mpub(TOPIC, bodies)
    return job.count // job.batch * job.batch


async def _mpub_asyncnsq(writer: Any, job: Job) -> int:
    bodies = [job.body] * job.batch
    for _ in range(job.count // job.batch):
        await writer.mpub(TOPIC, *bodies)
    return job.count // job.batch * job.batch


row("mpub", "sansio-asyncio", "nsq-sansio asyncio")(_anyio_publisher("asyncio", _mpub_async))
row("mpub", "sansio-trio", "nsq-sansio trio")(_anyio_publisher("trio", _mpub_async))
row("mpub", "sansio-blocking", "nsq-sansio blocking")(_blocking_publisher(_mpub_blocking))
row("mpub", "asyncnsq", "asyncnsq 1.2.1")(_asyncnsq_publisher(_mpub_asyncnsq))


row("mpub", "pynsq", "pynsq 0.9.1")(lambda job: _pynsq_publish(job, 1, job.batch))


@row("mpub", "gnsq", "gnsq 1.0.2")
def _gnsq_mpub(job: Job) -> Timing:
    import gnsq

    producer = gnsq.Producer([job.address])
    producer.start()
    producer.publish("warmup", b"x")
    bodies = [job.body] * job.batch
    t0 = time.perf_counter()
    for _ in range(job.count // job.batch):
        producer.multipublish(TOPIC, bodies)
    t1 = time.perf_counter()
    producer.close()
    return Timing(t0, t1, job.count // job.batch * job.batch)


# The Go tools run from the harness (no child runner).
ROWS.append(Row("consume", "consume/go", "Go `bench_reader` (ceiling)", None))
ROWS.append(Row("mpub", "mpub/go", "Go `bench_writer`, 2 connections (ceiling)", None))

GROUPS = {
    "consume": "consume (every message FIN'd)",
    "pub1": "PUB one by one (await each)",
    "pub100": "PUB, {concurrency} concurrent callers",
    "mpub": "MPUB of {batch}",
}
ALIASES = {"publish": ("pub1", "pub100", "mpub")}


# --- child process ----------------------------------------------------------------------------


def _child(key: str, job: Job) -> None:
    try:
        timing = RUNNERS[key](job)
    except ImportError as exc:
        print(json.dumps({"skipped": f"{exc}"}), flush=True)
        return
    rss_kb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    print(
        json.dumps(
            {"seconds": timing.t1 - timing.t0, "count": timing.count, "max_rss_kb": rss_kb}
            | timing.extra
        ),
        flush=True,
    )


# --- harness: nsqd, prefill, checks -----------------------------------------------------------


@dataclass
class Result:
    row: Row
    rate: float = 0.0
    seconds: float = 0.0
    max_rss_kb: int = 0
    error: str | None = None
    note: str = ""
    #: nsqd's own CPU time (user + system) per message of this row, in seconds.
    nsqd_cpu: float | None = None


class StatsPoller:
    """``/stats`` over one kept-alive HTTP connection (cheap enough to poll every few ms)."""

    def __init__(self, http_port: int) -> None:
        self._conn = http.client.HTTPConnection("127.0.0.1", http_port, timeout=5)

    def get(self, topic: str, channel: str | None = None) -> dict[str, Any]:
        query = f"/stats?format=json&topic={topic}"
        if channel is not None:
            query += f"&channel={channel}"
        self._conn.request("GET", query)
        data: dict[str, Any] = json.loads(self._conn.getresponse().read())
        return data

    def topic(self, topic: str) -> dict[str, Any] | None:
        for entry in self.get(topic).get("topics") or ():
            if entry.get("topic_name") == topic:
                found: dict[str, Any] = entry
                return found
        return None

    def channel(self, topic: str, channel: str) -> dict[str, Any] | None:
        for entry in self.get(topic, channel).get("topics") or ():
            if entry.get("topic_name") == topic:
                for chan in entry.get("channels") or ():
                    if chan.get("channel_name") == channel:
                        found: dict[str, Any] = chan
                        return found
        return None

    def close(self) -> None:
        self._conn.close()


def _prefill(nsqd: Any, count: int, body: bytes) -> None:
    """Create the channel, then MPUB ``count`` bodies and wait until the channel holds them."""
    nsqd.post(f"/topic/create?topic={TOPIC}")
    nsqd.post(f"/channel/create?topic={TOPIC}&channel={CHANNEL}")
    sock = socket.create_connection(("127.0.0.1", nsqd.tcp_port))
    sock.sendall(b"  V2")
    batch = 1000
    left = count
    while left:
        n = min(batch, left)
        payload = b"".join(struct.pack(">I", len(body)) + body for _ in range(n))
        payload = struct.pack(">I", n) + payload
        sock.sendall(b"MPUB " + TOPIC.encode() + b"\n" + struct.pack(">I", len(payload)) + payload)
        answer = b""
        while len(answer) < 10:
            chunk = sock.recv(64)
            if not chunk:
                raise RuntimeError("nsqd closed the prefill connection")
            answer += chunk
        if answer != struct.pack(">ii", 6, 0) + b"OK":
            raise RuntimeError(f"prefill MPUB answered {answer!r}")
        left -= n
    sock.close()
    poller = StatsPoller(nsqd.http_port)
    try:
        deadline = time.monotonic() + 30
        while True:
            chan = poller.channel(TOPIC, CHANNEL)
            if chan is not None and chan["depth"] == count:
                return
            if time.monotonic() > deadline:
                raise RuntimeError(f"prefill: channel holds {chan and chan['depth']} of {count}")
            time.sleep(0.01)
    finally:
        poller.close()


def _check_consumed(poller: StatsPoller, count: int, wait: float = 3.0) -> str | None:
    """None once nsqd shows every message delivered and FIN'd; else what is wrong."""
    deadline = time.monotonic() + wait
    while True:
        chan = poller.channel(TOPIC, CHANNEL)
        if chan is None:
            problem = "channel gone"
        else:
            seen = {
                k: chan[k]
                for k in (
                    "depth",
                    "in_flight_count",
                    "deferred_count",
                    "requeue_count",
                    "timeout_count",
                )
            }
            if chan["message_count"] == count and not any(seen.values()):
                return None
            problem = f"message_count={chan['message_count']} (expected {count}), " + ", ".join(
                f"{k}={v}" for k, v in seen.items()
            )
        if time.monotonic() > deadline:
            return "not every message was FIN'd: " + problem
        time.sleep(0.02)


def _check_published(poller: StatsPoller, count: int) -> str | None:
    topic = poller.topic(TOPIC)
    got = 0 if topic is None else topic["message_count"]
    if got != count:
        return f"nsqd's topic holds {got} messages, the client reported {count}"
    return None


def _cpu_seconds(pid: int | None) -> float | None:
    """CPU time a process has used so far, summed over its threads (Linux's schedstat, in
    nanoseconds; ``/proc/PID/stat``'s clock ticks are too coarse for a one-second row).
    None where there is no ``/proc``."""
    total = 0
    try:
        for task in os.listdir(f"/proc/{pid}/task"):
            with open(f"/proc/{pid}/task/{task}/schedstat") as f:
                total += int(f.read().split()[0])
    except (OSError, ValueError, IndexError):
        return None
    return total / 1e9


def _per_message(cpu0: float | None, cpu1: float | None, count: int) -> float | None:
    if cpu0 is None or cpu1 is None or count <= 0:
        return None
    return (cpu1 - cpu0) / count


def _nsqd_args(count: int, extra: list[str]) -> list[str]:
    # Everything in memory (bench_writer publishes for a fixed time: room for ~2M messages).
    return [f"--mem-queue-size={max(count + 1000, 2_000_000)}", *extra]


def run_row(r: Row, args: argparse.Namespace, bin_dir: str | None) -> Result:
    from transports.testing.real_nsq import RealNSQD, tool

    count = args.pub1_count if r.group == "pub1" else args.count
    with RealNSQD(_nsqd_args(count, args.nsqd_arg), bin_dir=bin_dir) as nsqd:
        if r.group == "consume":
            _prefill(nsqd, count, b"x" * args.body_size)
        if r.runner is None:
            exe = tool("bench_reader" if r.group == "consume" else "bench_writer", bin_dir)
            if exe is None:
                return Result(r, error="skipped: binary not found")
            if r.group == "consume":
                return _run_bench_reader(r, str(exe), nsqd, count, args)
            return _run_bench_writer(r, str(exe), nsqd, args)
        cmd = [
            sys.executable,
            os.path.abspath(__file__),
            "--child",
            r.key,
            nsqd.tcp_address,
            str(count),
            "--body-size",
            str(args.body_size),
            "--concurrency",
            str(args.concurrency),
            "--batch",
            str(args.batch),
            "--threads",
            str(args.threads),
        ]
        if args.run_concurrency is not None:
            cmd += ["--run-concurrency", str(args.run_concurrency)]
        env = dict(os.environ)
        env["PYTHONPATH"] = ROOT + os.pathsep + env.get("PYTHONPATH", "")
        cpu0 = _cpu_seconds(nsqd.pid)  # nsqd is idle while the child starts and connects
        try:
            proc = subprocess.run(
                cmd, capture_output=True, text=True, timeout=args.timeout, env=env
            )
        except subprocess.TimeoutExpired:
            return Result(r, error=f"timed out after {args.timeout:.0f}s")
        cpu1 = _cpu_seconds(nsqd.pid)
        lines = [line for line in proc.stdout.splitlines() if line.startswith("{")]
        if proc.returncode or not lines:
            tail = (proc.stderr or proc.stdout).strip().splitlines()[-3:]
            return Result(r, error=" | ".join(tail) or f"exit {proc.returncode}")
        data = json.loads(lines[-1])
        if "skipped" in data:
            return Result(r, error=f"skipped: {data['skipped']}")
        poller = StatsPoller(nsqd.http_port)
        try:
            if r.group == "consume":
                problem = _check_consumed(poller, count)
            else:
                problem = _check_published(poller, data["count"])
        finally:
            poller.close()
        if problem:
            return Result(r, error=problem)
        # Every message the child sent or took, not only the timed ones (consume rows time
        # the middle 80%), is what nsqd spent its CPU on.
        handled = count if r.group == "consume" else data["count"]
        return Result(
            r,
            rate=data["count"] / data["seconds"],
            seconds=data["seconds"],
            max_rss_kb=data["max_rss_kb"],
            nsqd_cpu=_per_message(cpu0, cpu1, handled),
        )


def _run_bench_reader(r: Row, exe: str, nsqd: Any, count: int, args: argparse.Namespace) -> Result:
    """bench_reader reads for ``-runfor`` and divides by it, so on a drained queue its own
    number means nothing: time it here, from nsqd's stats (polled every few ms)."""
    poller = StatsPoller(nsqd.http_port)
    proc = subprocess.Popen(
        [
            exe,
            f"--nsqd-tcp-address={nsqd.tcp_address}",
            f"--topic={TOPIC}",
            f"--channel={CHANNEL}",
            f"--size={args.body_size}",
            f"--rdy={MAX_IN_FLIGHT}",
            "--runfor=120s",
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        t0 = t1 = 0.0
        cpu0 = cpu1 = None
        deadline = time.monotonic() + args.timeout
        depth0 = depth1 = 0
        edge = count // 10
        while time.monotonic() < deadline:
            chan = poller.channel(TOPIC, CHANNEL)
            now = time.perf_counter()
            if chan is None:
                time.sleep(0.005)
                continue
            depth = chan["depth"]
            if not t0 and depth <= count - edge:
                t0, depth0 = now, depth
                cpu0 = _cpu_seconds(nsqd.pid)
            if t0 and depth <= edge:
                t1, depth1 = now, depth
                cpu1 = _cpu_seconds(nsqd.pid)
                break
            time.sleep(0.002)
        if not t1 or depth0 == depth1:
            return Result(r, error=f"bench_reader did not take {count} messages in time")
        # bench_reader writes FINs in bursts and flushes the rest once a second, from another
        # goroutine without a lock: a few of its last FINs may never reach nsqd. Tolerated
        # (and said) for the ceiling only: nothing requeued, timed out or left undelivered.
        problem = _check_consumed(poller, count, wait=3.0)
        note = ""
        if problem:
            chan = poller.channel(TOPIC, CHANNEL) or {}
            stuck = chan.get("in_flight_count", 0)
            others = ("depth", "deferred_count", "requeue_count", "timeout_count")
            if chan.get("message_count") != count or any(chan.get(k) for k in others):
                return Result(r, error=problem)
            if stuck > 2 * MAX_IN_FLIGHT:
                return Result(r, error=problem)
            note = f"{stuck} FINs never flushed by bench_reader"
        return Result(
            r,
            rate=(depth0 - depth1) / (t1 - t0),
            seconds=t1 - t0,
            note=note,
            nsqd_cpu=_per_message(cpu0, cpu1, depth0 - depth1),
        )
    finally:
        proc.kill()
        proc.wait()
        poller.close()


def _run_bench_writer(r: Row, exe: str, nsqd: Any, args: argparse.Namespace) -> Result:
    cpu0 = _cpu_seconds(nsqd.pid)
    proc = subprocess.run(
        [
            exe,
            f"--nsqd-tcp-address={nsqd.tcp_address}",
            f"--topic={TOPIC}",
            f"--size={args.body_size}",
            f"--batch-size={args.batch}",
            f"--runfor={args.go_runfor}s",
        ],
        capture_output=True,
        text=True,
        timeout=args.timeout,
    )
    cpu1 = _cpu_seconds(nsqd.pid)
    match = re.search(r"duration: (\S+) - .* - ([\d.]+)ops/s", proc.stderr + proc.stdout)
    if proc.returncode or match is None:
        return Result(r, error=f"bench_writer failed: {(proc.stderr or proc.stdout)[-300:]}")
    seconds = _go_duration(match.group(1))
    poller = StatsPoller(nsqd.http_port)
    try:
        topic = poller.topic(TOPIC)
    finally:
        poller.close()
    stored = 0 if topic is None else topic["message_count"]
    claimed = float(match.group(2)) * seconds
    if not stored or abs(stored - claimed) > args.batch * 2:
        return Result(r, error=f"bench_writer claimed {claimed:.0f} messages, nsqd has {stored}")
    return Result(
        r, rate=stored / seconds, seconds=seconds, nsqd_cpu=_per_message(cpu0, cpu1, stored)
    )


def _go_duration(text: str) -> float:
    """Go's time.Duration.String() (``1.0021s``, ``950.2ms``, ``1m2.5s``) in seconds."""
    units = {"h": 3600.0, "m": 60.0, "s": 1.0, "ms": 1e-3, "us": 1e-6, "µs": 1e-6, "ns": 1e-9}
    total = 0.0
    for number, unit in re.findall(r"([\d.]+)(h|ms|us|µs|ns|m|s)", text):
        total += float(number) * units[unit]
    return total


# --- report -----------------------------------------------------------------------------------


def _chosen(args: argparse.Namespace) -> list[Row]:
    if not args.only:
        return list(ROWS)
    wanted: list[str] = []
    for part in args.only:
        wanted.extend(ALIASES.get(part, (part,)))
    groups = [w for w in wanted if w in GROUPS]  # a group by its name ("pub1" is not pub100)
    parts = [w for w in wanted if w not in GROUPS]
    return [r for r in ROWS if r.group in groups or any(w in r.key for w in parts)]


def _iter_best(results: dict[str, list[Result]]) -> Iterator[tuple[str, Result]]:
    for key, tries in results.items():
        ok = [t for t in tries if not t.error]
        yield key, (max(ok, key=lambda t: t.rate) if ok else tries[-1])


def _report(rows: list[Row], best: dict[str, Result], args: argparse.Namespace) -> str:
    lines: list[str] = []
    out = lines.append
    rates = {k: r.rate for k, r in best.items() if not r.error}
    for group, title in GROUPS.items():
        members = [r for r in rows if r.group == group]
        if not members:
            continue
        title = title.format(concurrency=args.concurrency, batch=args.batch)
        peers = [k for k in rates if k.startswith(group + "/") and _is_peer(k)]
        top = max(peers, key=lambda k: rates[k]) if peers else None
        n = args.pub1_count if group == "pub1" else args.count
        out(f"\n**{title}** ({n:,} messages of {args.body_size} bytes)\n")
        out("| client | msgs/s | vs best Python peer | max RSS | nsqd CPU per msg | nsqd busy |")
        out("| --- | ---: | ---: | ---: | ---: | ---: |")
        for r in members:
            res = best[r.key]
            if res.error:
                out(f"| {r.label} | {res.error} | | | | |")
                continue
            ratio = f"{res.rate / rates[top]:.2f}x" if top else ""
            if r.key == top:
                ratio = "1.00x (best peer)"
            rss = f"{res.max_rss_kb / 1024:.0f} MiB" if res.max_rss_kb else ""
            note = f" ({res.note})" if res.note else ""
            cpu = busy = ""
            if res.nsqd_cpu is not None:
                # busy: the share of one core nsqd used while taking this row's rate.
                cpu = f"{res.nsqd_cpu * 1e6:.2f} us"
                busy = f"{res.nsqd_cpu * res.rate:.0%}"
            out(f"| {r.label}{note} | {res.rate:,.0f} | {ratio} | {rss} | {cpu} | {busy} |")
    out("")
    out("**Targets** (ratios from this run)\n")
    out("| target | measured | verdict |")
    out("| --- | ---: | --- |")
    for name, measured, goal in _targets(rates):
        if not goal:  # a ratio worth seeing, with no target of its own
            out(f"| {name} | {measured:.2f}x | (reported) |")
            continue
        verdict = "ok" if measured >= goal else f"MISSED by {(1 - measured / goal) * 100:.0f}%"
        out(f"| {name} (>= {goal:g}x) | {measured:.2f}x | {verdict} |")
    return "\n".join(lines)


def _is_peer(key: str) -> bool:
    client = key.split("/", 1)[1]
    return client in ("asyncnsq", "pynsq", "gnsq")


def _best_peer(rates: dict[str, float], group: str) -> float | None:
    peers = [v for k, v in rates.items() if k.startswith(group + "/") and _is_peer(k)]
    return max(peers) if peers else None


def _targets(rates: dict[str, float]) -> list[tuple[str, float, float]]:
    """(what, measured ratio, target ratio) for every target whose rows ran."""
    found: list[tuple[str, float, float]] = []

    def ratio(name: str, a: str, b: str | float | None, goal: float) -> None:
        base = rates.get(b) if isinstance(b, str) else b
        if a in rates and base:
            found.append((name, rates[a] / base, goal))

    p100 = _best_peer(rates, "pub100")
    ratio("PUB x100 asyncio / best peer", "pub100/sansio-asyncio", p100, 3.0)
    ratio("PUB x100 trio / asyncio", "pub100/sansio-trio", "pub100/sansio-asyncio", 0.8)
    ratio("PUB x100 blocking threads / best peer", "pub100/sansio-blocking-threads", p100, 2.0)
    ratio("PUB x100 blocking publish_async / best peer", "pub100/sansio-blocking-async", p100, 3.0)
    for rt in ("asyncio", "trio", "blocking-async"):
        ratio(f"PUB x100 {rt} / bare socket", f"pub100/sansio-{rt}", "pub100/bare-socket", 0.0)
    ratio(
        "PUB x100 blocking threads / bare socket shared by 100 threads",
        "pub100/sansio-blocking-threads",
        "pub100/bare-threads",
        0.0,
    )
    ratio("bare socket 100 threads / best peer", "pub100/bare-threads", p100, 0.0)
    ratio("bare socket / best peer", "pub100/bare-socket", p100, 0.0)
    ratio("bare 2 connections / bare 1", "pub100/bare-socket-2", "pub100/bare-socket", 0.0)
    for rt in ("asyncio", "trio", "blocking-threads", "blocking-async"):
        ratio(
            f"PUB x100 {rt}: 2 connections / 1",
            f"pub100/sansio-{rt}-pool2",
            f"pub100/sansio-{rt}",
            0.0,
        )
    p1 = _best_peer(rates, "pub1")
    for rt in ("asyncio", "trio", "blocking"):
        ratio(f"PUB one by one {rt} / best peer", f"pub1/sansio-{rt}", p1, 1.3)
    for rt in ("asyncio", "trio", "blocking"):
        # Informational: the share of the physical ceiling (no target: goal 0).
        ratio(f"PUB one by one {rt} / bare socket", f"pub1/sansio-{rt}", "pub1/bare-socket", 0.0)
    ratio("consume asyncio `async for` / Go", "consume/sansio-asyncio-iter", "consume/go", 0.6)
    ratio("consume blocking `for msg` / Go", "consume/sansio-blocking-iter", "consume/go", 0.75)
    ratio(
        "consume asyncio run() / `async for`",
        "consume/sansio-asyncio-run",
        "consume/sansio-asyncio-iter",
        0.8,
    )
    ratio(
        "consume blocking run(concurrency=8) / `for msg`",
        "consume/sansio-blocking-run",
        "consume/sansio-blocking-iter",
        0.7,
    )
    pm = _best_peer(rates, "mpub")
    for rt in ("asyncio", "trio", "blocking"):
        ratio(f"MPUB {rt} / best peer (stays at nsqd's limit)", f"mpub/sansio-{rt}", pm, 1.0)
        ratio(f"MPUB {rt} / Go bench_writer", f"mpub/sansio-{rt}", "mpub/go", 0.0)
    return found


def main() -> None:
    parser = argparse.ArgumentParser(
        description="nsq-sansio and its peers against the real nsqd (one table, one run)"
    )
    parser.add_argument("--child", nargs=3, metavar=("ROW", "ADDRESS", "COUNT"), help="internal")
    parser.add_argument("-n", "--count", type=int, default=200_000, help="messages per row")
    parser.add_argument(
        "--pub1-count",
        type=int,
        default=None,
        help="messages for the one-by-one PUB rows (default: count / 10; these run at ~10k/s)",
    )
    parser.add_argument("--body-size", type=int, default=100)
    parser.add_argument("--concurrency", type=int, default=100, help="callers in pub100 rows")
    parser.add_argument("--batch", type=int, default=200, help="bodies per MPUB")
    parser.add_argument(
        "--threads", type=int, default=8, help="blocking run(handler, concurrency=)"
    )
    parser.add_argument(
        "--run-concurrency",
        type=int,
        default=None,
        help="anyio run(concurrency=); default: its own",
    )
    parser.add_argument("--repeat", type=int, default=1, help="rounds; each row keeps its best")
    parser.add_argument("--only", nargs="*", help="groups (consume, publish, pub1, pub100, mpub)")
    parser.add_argument("--nsqd-bin", help="folder with nsqd, bench_reader, bench_writer")
    parser.add_argument("--nsqd-arg", action="append", default=[], help="extra nsqd flag")
    parser.add_argument("--go-runfor", type=float, default=1.0, help="bench_writer seconds")
    parser.add_argument("--timeout", type=float, default=300.0, help="seconds per measurement")
    parser.add_argument("--output", help="also write the markdown table to this file")
    parser.add_argument("--list", action="store_true", help="list the rows and exit")
    args = parser.parse_args()
    if args.pub1_count is None:
        args.pub1_count = max(args.count // 10, 1)
    if args.child:
        key, address, count = args.child
        job = Job(
            address=address,
            count=int(count),
            body=b"x" * args.body_size,
            concurrency=args.concurrency,
            batch=args.batch,
            max_in_flight=MAX_IN_FLIGHT,
            run_concurrency=args.run_concurrency,
            threads=args.threads,
        )
        _child(key, job)
        return
    if args.list:
        for r in ROWS:
            print(f"{r.key:34} {r.label}")
        return

    from transports.testing.real_nsq import find_binaries

    folder = find_binaries(args.nsqd_bin)
    if folder is None:
        print(
            "no nsqd binary found (--nsqd-bin DIR, $NSQ_BIN_DIR, or "
            "../shared/reference/nsq-1.3.0 beside the checkout): nothing to measure"
        )
        return
    bin_dir = str(folder)
    rows = _chosen(args)
    results: dict[str, list[Result]] = {r.key: [] for r in rows}
    print(
        f"nsqd: {folder}; {len(rows)} rows x {args.repeat} rounds; Python {sys.version.split()[0]}",
        flush=True,
    )
    # Rounds interleave the rows, so load from other jobs hits every client alike.
    for round_no in range(1, args.repeat + 1):
        for r in rows:
            res = run_row(r, args, bin_dir)
            results[r.key].append(res)
            shown = res.error or f"{res.rate:>11,.0f} msgs/s"
            print(f"  [{round_no}/{args.repeat}] {r.key:34} {shown}", flush=True)
    best = dict(_iter_best(results))
    table = _report(rows, best, args)
    print(table)
    if args.output:
        with open(args.output, "w") as f:
            f.write(table + "\n")


if __name__ == "__main__":
    main()
