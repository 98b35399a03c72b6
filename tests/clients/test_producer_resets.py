"""A publish nsqd refuses fatally never makes the good ones pipelined with it fail, on every
runtime, even when nsqd's close resets the connection and its last answers are lost.

nsqd closes the connection after a fatal refusal (``E_BAD_MESSAGE``...). When our later,
pipelined commands are still unread there, its kernel resets the connection (RST), and the
reset may destroy answers nsqd had already written: every publish in flight then has an
unknown outcome. :class:`RefusingNSQD` does that on purpose, deterministically: a bad body with
more bytes read behind it resets the connection (``SO_LINGER`` 0) and drops the answers it had
not yet written for that read; a bad body with nothing behind it gets ``E_BAD_MESSAGE`` and a
clean close, as nsqd's own does.
"""

from __future__ import annotations

import socket
import struct
import threading
from collections import Counter

import pytest
from support.brokers import unique
from support.runtimes import Runtime

from nsq_sansio.errors import BadMessage

pytestmark = pytest.mark.anyio

_OK = struct.pack(">ii", 6, 0) + b"OK"


def _error(text: bytes) -> bytes:
    return struct.pack(">ii", len(text) + 4, 1) + text


class RefusingNSQD:
    """Loopback nsqd storing PUB/MPUB/DPUB bodies up to ``max_msg_size`` (see the module
    docstring). ``stored`` lists every body stored, in order; ``unconfirmed`` the bodies stored
    whose OK a reset then destroyed (their publisher cannot know they were stored); ``resets``
    counts the connections reset, ``refusals`` the clean refusals."""

    def __init__(self, max_msg_size: int = 1024) -> None:
        self.max_msg_size = max_msg_size
        self.stored: list[bytes] = []
        #: Every publish command read: (command, number of bodies).
        self.commands: list[tuple[bytes, int]] = []
        self.unconfirmed: list[bytes] = []
        self.resets = 0
        self.refusals = 0
        self._listener = socket.create_server(("127.0.0.1", 0))
        self._listener.settimeout(0.1)
        self.address = f"127.0.0.1:{self._listener.getsockname()[1]}"
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []
        self._accepting = threading.Thread(target=self._accept, daemon=True)
        self._accepting.start()

    def close(self) -> None:
        self._stop.set()
        self._accepting.join(5)
        for thread in self._threads:
            thread.join(5)
        self._listener.close()

    def __enter__(self) -> RefusingNSQD:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _accept(self) -> None:
        while not self._stop.is_set():
            try:
                conn, _ = self._listener.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            thread = threading.Thread(target=self._serve, args=(conn,), daemon=True)
            self._threads.append(thread)
            thread.start()

    def _serve(self, conn: socket.socket) -> None:
        conn.settimeout(0.2)
        buffer = b""
        with conn:
            while not self._stop.is_set():
                try:
                    data = conn.recv(65536)
                except TimeoutError:
                    continue
                except OSError:
                    return
                if not data:
                    return
                buffer += data
                buffer, out, refusal = self._handle(buffer)
                if refusal is None:
                    if out:
                        conn.sendall(out)
                    continue
                stored_now, error = refusal
                if buffer:
                    # Commands unread behind the refused one: the kernel resets the connection,
                    # and this read's answers are lost with it.
                    self.resets += 1
                    self.unconfirmed.extend(stored_now)
                    conn.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
                else:
                    self.refusals += 1
                    conn.sendall(out + _error(error))
                return

    def _handle(self, buffer: bytes) -> tuple[bytes, bytes, tuple[list[bytes], bytes] | None]:
        """Serve every whole command in ``buffer``: (what is left, the answers, and on a
        refusal the bodies stored in this read and the error)."""
        out = b""
        stored_now: list[bytes] = []
        while True:
            if buffer.startswith(b"  V2"):
                buffer = buffer[4:]
            line_end = buffer.find(b"\n")
            if line_end < 0:
                return buffer, out, None
            words = buffer[:line_end].split(b" ")
            command = words[0]
            if command == b"NOP":
                buffer = buffer[line_end + 1 :]
                continue
            at = line_end + 1
            if len(buffer) < at + 4:
                return buffer, out, None
            size = int.from_bytes(buffer[at : at + 4], "big")
            if len(buffer) < at + 4 + size:
                return buffer, out, None
            body = buffer[at + 4 : at + 4 + size]
            buffer = buffer[at + 4 + size :]
            if command == b"IDENTIFY":
                out += _OK
                continue
            if command == b"MPUB":
                bodies, offset = [], 4
                for _ in range(int.from_bytes(body[:4], "big")):
                    length = int.from_bytes(body[offset : offset + 4], "big")
                    bodies.append(body[offset + 4 : offset + 4 + length])
                    offset += 4 + length
            else:
                bodies = [body]
            self.commands.append((command, len(bodies)))
            if any(len(b) > self.max_msg_size for b in bodies):
                kind = command.decode()
                error = b"E_BAD_MESSAGE %s message too big" % kind.encode()
                return buffer, out, (stored_now, error)
            self.stored.extend(bodies)
            stored_now.extend(bodies)
            out += _OK


@pytest.mark.parametrize(
    ("coalesce", "bad_call"), [(True, "publish"), (False, "publish"), (True, "multi_publish")]
)
async def test_good_publishes_pipelined_with_refused_ones_all_succeed(
    runtime: Runtime, coalesce: bool, bad_call: str
) -> None:
    """100 concurrent publishes, every tenth too big (a PUB, or an MPUB with one good body):
    only those fail (BadMessage); every other one succeeds and is stored once, or twice only
    when a reset destroyed the OK it got (its publisher could not know it was stored:
    at-least-once). Then the producer pipelines again."""
    topic = unique()
    calls = [
        (
            bad_call,
            (
                topic,
                [b"ok%d" % i, b"B" * 2000]
                if bad_call == "multi_publish"
                else b"B" * 2000 + b"%d" % i,
            ),
        )
        if i % 10 == 5
        else ("publish", (topic, b"%d" % i))
        for i in range(100)
    ]
    bad = {i for i in range(100) if i % 10 == 5}
    with RefusingNSQD() as server:
        async with runtime.producer(
            server.address, coalesce=coalesce, timeout=20, connect_timeout=2
        ) as p:
            await p.publish(topic, b"warm")
            outcomes = await p.concurrently(calls, timeout=20)
            stats = p.stats()
            assert server.resets > 0  # the case under test happened
            # Pipelining again (with coalescing: several PUBs in one MPUB).
            mark = len(server.commands)
            after = [("publish", (topic, b"after%d" % i)) for i in range(200)]
            assert await p.concurrently(after, timeout=20) == [None] * 200
            if coalesce:
                assert max(n for _, n in server.commands[mark:]) > 1
    failed = {i for i, error in enumerate(outcomes) if error is not None}
    assert failed == bad, [outcomes[i] for i in sorted(failed - bad)][:3]
    assert all(isinstance(outcomes[i], BadMessage) for i in bad)
    assert (stats.published, stats.failed) == (91, 10)
    counts = Counter(server.stored)
    unconfirmed = set(server.unconfirmed)
    for i, (_, (_, body)) in enumerate(calls):
        if i in bad:
            assert not any(counts[b] for b in (body if isinstance(body, list) else [body]))
        elif body in unconfirmed:
            assert counts[body] >= 1
        else:
            assert counts[body] == 1, (body, counts[body])
