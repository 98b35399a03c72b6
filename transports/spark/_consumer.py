"""The streaming source's consumer: messages are held in flight across micro-batches.

Private to the Spark source. Spark's driver-side reader needs something the general blocking
consumer does not promise: messages taken for a micro-batch stay in flight (unanswered) until
Spark has durably completed that batch, possibly for minutes, while a background thread answers
heartbeats and TOUCHes them so nsqd does not time them out. FIN, REQ and TOUCH are sent on the
connection a message came from; a message whose connection died is not answered (nsqd
requeues it itself, which is the at-least-once contract).

One IO thread per consumer owns the reads; commands from the caller's thread are written under
the same lock. No TLS here (plain TCP, optionally snappy/deflate and AUTH through the core).
"""

from __future__ import annotations

import contextlib
import logging
import selectors
import socket
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from collections import deque
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

from nsq_sansio.config import Config
from nsq_sansio.connection import ClientConnection, ConnectionState
from nsq_sansio.discovery import LookupdAddress, NSQDAddress, parse_lookup_response
from nsq_sansio.errors import NSQError
from nsq_sansio.events import (
    ConnectionClosed,
    ConnectionReady,
    Message,
    MessageTakenBack,
    Subscribed,
    TLSUpgradeRequired,
)

__all__ = ["HeldMessage", "SourceConsumer", "lookup_nsqds"]

_log = logging.getLogger("transports.spark.consumer")

_TICK = 0.05
_MAX_CONNECTIONS_PER_NSQD = 16


@dataclass(eq=False)
class _Node:
    address: str
    slot: int
    sock: socket.socket
    conn: ClientConnection
    generation: int
    rdy: int = 0
    subscribed: bool = False
    closed: bool = False


@dataclass(eq=False, slots=True)
class HeldMessage:
    """A message received and not answered yet, with the connection it must be answered on."""

    message: Message
    address: str
    node: _Node = field(repr=False)

    @property
    def alive(self) -> bool:
        """False once the connection it came on is gone (nsqd will redeliver it)."""
        return not self.node.closed


def lookup_nsqds(lookupd: Sequence[str], topic: str | None, timeout: float) -> list[str]:
    """nsqd TCP addresses from every lookupd (``/lookup?topic=`` or ``/nodes``), unioned.

    Raises when no lookupd answered at all; an empty list means they answered with no nsqd.
    """
    found: dict[str, None] = {}
    errors: list[str] = []
    for text in lookupd:
        address = LookupdAddress.parse(text)
        if topic is None:
            url = f"{address}/nodes"
        else:
            url = f"{address}/lookup?topic={urllib.parse.quote(topic)}"
        try:
            with urllib.request.urlopen(url, timeout=timeout) as response:
                status, body = response.status, response.read()
        except urllib.error.HTTPError as exc:
            status, body = exc.code, exc.read()
        except OSError as exc:
            errors.append(f"{address}: {exc}")
            continue
        answer = parse_lookup_response(address, status, body)
        if hasattr(answer, "error"):
            errors.append(f"{address}: {answer.error}")
            continue
        for producer in answer.producers:
            found[str(producer)] = None
    if errors and len(errors) == len(lookupd):
        raise NSQError("no nsqlookupd answered: " + "; ".join(errors))
    return list(found)


class SourceConsumer:
    """Subscribe to ``topic``/``channel`` on every nsqd given or found; buffer what arrives."""

    def __init__(
        self,
        topic: str,
        channel: str,
        *,
        nsqd: Sequence[str] = (),
        lookupd: Sequence[str] = (),
        max_in_flight: int = 1000,
        config: Config | None = None,
        connect_timeout: float = 5.0,
        lookupd_poll_interval: float = 60.0,
        touch_interval: float | None = None,
    ) -> None:
        if not nsqd and not lookupd:
            raise ValueError("SourceConsumer needs nsqd or lookupd addresses")
        self.topic = topic
        self.channel = channel
        self._static = [str(NSQDAddress.parse(a)) for a in nsqd]
        self._lookupd = list(lookupd)
        self._max_in_flight = max_in_flight
        self._config = config or Config()
        if self._config.tls_v1:
            raise NSQError("the Spark source does not support TLS to nsqd yet")
        self._connect_timeout = connect_timeout
        self._poll_interval = lookupd_poll_interval
        self._touch_interval = touch_interval
        self._lock = threading.RLock()
        self._arrived = threading.Condition(self._lock)
        # (address, slot): one nsqd caps RDY per connection (max_rdy_count, 2500 by default),
        # so a max_in_flight above that opens several connections to the same nsqd.
        self._nodes: dict[tuple[str, int], _Node] = {}
        self._per_nsqd = 1
        self._known: list[str] = list(self._static)
        self._retry_at: dict[str, float] = {}
        self._failures: dict[str, int] = {}
        self._last_error: dict[str, str] = {}
        self._buffer: deque[HeldMessage] = deque()
        self._held: dict[tuple[str, bytes], HeldMessage] = {}
        self._generation = 0
        self._selector = selectors.DefaultSelector()
        self._thread: threading.Thread | None = None
        self._stop = threading.Event()
        self._next_poll = 0.0
        self._next_touch = 0.0
        self.taken_back = 0

    # --- lifecycle (caller's thread) ---------------------------------------------------------

    def start(self) -> None:
        """Connect and subscribe; raises when no nsqd could be subscribed to in time."""
        now = time.monotonic()
        if self._lookupd:
            self._poll(now)
        for address in self._known:
            self._connect(address, 0, now)
        self._thread = threading.Thread(target=self._run, name="nsq-spark-source", daemon=True)
        self._thread.start()
        if not self._known:
            return  # lookupd knows no nsqd with the topic yet: found by later polls
        deadline = now + self._connect_timeout
        with self._lock:
            while not any(n.subscribed for n in self._nodes.values()):
                left = deadline - time.monotonic()
                if left <= 0:
                    details = "; ".join(f"{a}: {e}" for a, e in self._last_error.items())
                    raise NSQError(
                        f"could not subscribe to {self.topic!r}/{self.channel!r} on any nsqd "
                        f"of {self._known} within {self._connect_timeout}s"
                        + (f" ({details})" if details else "")
                    )
                self._arrived.wait(min(left, _TICK))

    def close(self, requeue: bool = True) -> None:
        """REQ every message still unanswered (when ``requeue``), then close the connections."""
        with self._lock:
            if requeue:
                for held in list(self._buffer) + list(self._held.values()):
                    self._answer(held, "requeue")
            self._buffer.clear()
            self._held.clear()
            for node in self._nodes.values():
                if not node.closed:
                    self._flush(node)
        self._stop.set()
        if self._thread is not None:
            self._thread.join(5.0)
        with self._lock:
            for node in list(self._nodes.values()):
                self._drop(node, None)
        self._selector.close()

    # --- taking and answering (caller's thread) --------------------------------------------

    def take(self, limit: int, wait: float, linger: float = 0.0) -> list[HeldMessage]:
        """Up to ``limit`` buffered messages, waiting up to ``wait`` s for the first and then up
        to ``linger`` s for more. They stay in flight until :meth:`finish` / :meth:`requeue`."""
        deadline = time.monotonic() + wait
        taken: list[HeldMessage] = []
        with self._lock:
            while True:
                while self._buffer and len(taken) < limit:
                    held = self._buffer.popleft()
                    if held.alive:
                        self._held[(held.address, held.message.id)] = held
                        taken.append(held)
                if len(taken) >= limit:
                    break
                now = time.monotonic()
                if taken and linger > 0:
                    deadline = min(deadline, now + linger)
                    linger = 0.0
                if now >= deadline:
                    break
                self._arrived.wait(min(deadline - now, _TICK))
        return taken

    def finish(self, messages: Iterable[HeldMessage]) -> int:
        """FIN the messages still in flight on a live connection; returns how many were sent."""
        return self._answer_all(messages, "finish")

    def requeue(self, messages: Iterable[HeldMessage]) -> int:
        return self._answer_all(messages, "requeue")

    def connected(self) -> list[str]:
        with self._lock:
            live = [n.address for n in self._nodes.values() if n.subscribed and not n.closed]
            return sorted(set(live))

    def _answer_all(self, messages: Iterable[HeldMessage], how: str) -> int:
        sent = 0
        with self._lock:
            touched: set[_Node] = set()
            for held in messages:
                if self._answer(held, how):
                    sent += 1
                    touched.add(held.node)
            for node in touched:
                self._flush(node)
        return sent

    def _answer(self, held: HeldMessage, how: str) -> bool:
        self._held.pop((held.address, held.message.id), None)
        node = held.node
        if node.closed or not node.conn.is_in_flight(held.message.id):
            return False
        if how == "finish":
            node.conn.finish(held.message.id)
        else:
            node.conn.requeue(held.message.id, 0.0)
        return True

    # --- IO thread ---------------------------------------------------------------------------

    def _run(self) -> None:
        try:
            while not self._stop.is_set():
                ready: list[tuple[selectors.SelectorKey, int]] = []
                if self._selector.get_map():
                    try:
                        ready = self._selector.select(_TICK)
                    except (OSError, ValueError):
                        self._stop.wait(_TICK)
                else:
                    self._stop.wait(_TICK)
                now = time.monotonic()
                with self._lock:
                    for key, _ in ready:
                        node: _Node = key.data
                        if node.closed:
                            continue
                        try:
                            data = node.sock.recv(1 << 18)
                        except (BlockingIOError, InterruptedError):
                            continue
                        except OSError as exc:
                            self._drop(node, f"read failed: {exc}")
                            continue
                        self._feed(node, data, now)
                    self._housekeeping(now)
                self._blocking_chores(now)
        except Exception:  # pragma: no cover - a bug here must not hang the query silently
            _log.exception("nsq source IO thread crashed")
            with self._lock:
                for node in list(self._nodes.values()):
                    self._drop(node, "IO thread crashed")

    def _feed(self, node: _Node, data: bytes, now: float) -> None:
        events = node.conn.receive_data(data, now)
        arrived = False
        for event in events:
            if isinstance(event, Message):
                self._buffer.append(HeldMessage(event, node.address, node))
                arrived = True
            elif isinstance(event, ConnectionReady):
                node.conn.subscribe(self.topic, self.channel)
                per_connection = max(1, event.settings.max_rdy_count)
                wanted = -(-self._max_in_flight // (per_connection * max(1, len(self._known))))
                self._per_nsqd = max(self._per_nsqd, min(wanted, _MAX_CONNECTIONS_PER_NSQD))
            elif isinstance(event, Subscribed):
                node.subscribed = True
                self._failures.pop(node.address, None)
                self._last_error.pop(node.address, None)
                self._rebalance()
                arrived = True
            elif isinstance(event, MessageTakenBack):
                self.taken_back += 1
                _log.warning("nsqd %s took a message back: %s", node.address, event.error)
            elif isinstance(event, ConnectionClosed):
                error = None if event.error is None else str(event.error)
                self._drop(node, error)
                return
            elif isinstance(event, TLSUpgradeRequired):  # pragma: no cover - TLS is refused
                self._drop(node, "TLS is not supported by the Spark source")
                return
        if node.subscribed and node.rdy and node.conn.rdy_remaining <= node.rdy // 4:
            node.conn.send_ready(node.rdy)  # nsqd treats RDY as a window; refresh the count
        self._flush(node)
        if arrived:
            self._arrived.notify_all()

    def _housekeeping(self, now: float) -> None:
        for node in list(self._nodes.values()):
            if node.closed:
                continue
            deadline = node.conn.next_deadline()
            if deadline is not None and now >= deadline:
                for event in node.conn.handle_timer(now):
                    if isinstance(event, ConnectionClosed):
                        self._drop(node, str(event.error))
        if now >= self._next_touch:
            self._touch_all(now)

    def _blocking_chores(self, now: float) -> None:
        """Lookupd polls and connects, called WITHOUT the lock held: a slow lookupd or a
        blackholed nsqd must not stall take()/finish() (a trigger) for connect_timeout."""
        if self._lookupd and now >= self._next_poll:
            self._poll(now)
        with self._lock:
            wanted = [
                (address, slot)
                for address in self._known
                if now >= self._retry_at.get(address, 0.0)
                for slot in range(self._per_nsqd)
                if (address, slot) not in self._nodes
            ]
        for address, slot in wanted:
            if self._stop.is_set():
                return
            self._connect(address, slot, now)

    def _touch_all(self, now: float) -> None:
        """TOUCH every message in flight: buffered and held for a batch alike.

        Every ``touch_interval`` (by default a third of the shortest msg_timeout nsqd
        announced), so a message is touched well before it could time out.
        """
        interval = self._touch_interval
        if interval is None:
            timeouts = [
                n.conn.settings.msg_timeout / 1000
                for n in self._nodes.values()
                if n.conn.settings is not None and not n.closed
            ]
            if not timeouts:
                self._next_touch = now + _TICK  # not negotiated yet: look again soon
                return
            interval = min(timeouts) / 3
        for node in self._nodes.values():
            if node.closed or node.conn.state is not ConnectionState.SUBSCRIBED:
                continue
            for message_id in node.conn.in_flight:
                node.conn.touch(message_id)
            self._flush(node)
        self._next_touch = now + interval

    def _poll(self, now: float) -> None:
        self._next_poll = now + self._poll_interval
        try:
            found = lookup_nsqds(self._lookupd, self.topic, self._connect_timeout)
        except NSQError as exc:
            _log.warning("%s", exc)
            return
        with self._lock:
            for address in found:
                if address not in self._known:
                    self._known.append(address)

    def _connect(self, address: str, slot: int, now: float) -> None:
        host, _, port = address.rpartition(":")
        host = host.strip("[]")
        try:
            sock = socket.create_connection((host, int(port)), timeout=self._connect_timeout)
        except OSError as exc:
            with self._lock:
                self._schedule_retry(address, f"connect failed: {exc}", now)
            return
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        sock.settimeout(30.0)
        conn = ClientConnection(self._config.identify_body(), auth_secret=self._config.auth_secret)
        with self._lock:
            self._generation += 1
            node = _Node(address, slot, sock, conn, self._generation)
            self._nodes[(address, slot)] = node
            try:
                self._flush(node)
                sock.setblocking(False)
                self._selector.register(sock, selectors.EVENT_READ, node)
            except (OSError, ValueError) as exc:
                self._drop(node, f"write failed: {exc}")

    def _schedule_retry(self, address: str, error: str, now: float) -> None:
        failures = self._failures.get(address, 0) + 1
        self._failures[address] = failures
        self._last_error[address] = error
        delay = min(self._config.reconnect_delay * 2 ** (failures - 1), 30.0)
        self._retry_at[address] = now + delay
        _log.warning("nsqd %s: %s (retry in %.1fs)", address, error, delay)

    def _flush(self, node: _Node) -> None:
        data = node.conn.data_to_send()
        if not data or node.closed:
            return
        try:
            node.sock.setblocking(True)
            node.sock.settimeout(30.0)
            node.sock.sendall(data)
            node.sock.setblocking(False)
        except OSError as exc:
            self._drop(node, f"write failed: {exc}")

    def _drop(self, node: _Node, error: str | None) -> None:
        if node.closed:
            return
        node.closed = True
        if self._nodes.get((node.address, node.slot)) is node:
            del self._nodes[(node.address, node.slot)]
        with contextlib.suppress(KeyError, ValueError, OSError):
            self._selector.unregister(node.sock)
        with contextlib.suppress(OSError):
            node.sock.close()
        self._buffer = deque(h for h in self._buffer if h.node is not node)
        if error is not None and not self._stop.is_set():
            self._schedule_retry(node.address, error, time.monotonic())
        self._rebalance()
        self._arrived.notify_all()

    def _rebalance(self) -> None:
        """Spread max_in_flight over the subscribed connections (at least 1 each)."""
        live = [n for n in self._nodes.values() if n.subscribed and not n.closed]
        if not live:
            return
        share = max(1, self._max_in_flight // len(live))
        for node in live:
            rdy = min(share, node.conn.max_rdy_count)
            if rdy != node.rdy:
                node.rdy = rdy
                node.conn.send_ready(rdy)
                self._flush(node)
