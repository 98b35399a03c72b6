"""The IO thread of the blocking transport: one selectors loop over every socket of an owner.

An :class:`IOLoop` runs in one daemon thread. It owns non-blocking TCP sockets ("links"), a
wake-up socketpair and a queue of calls handed over by other threads. Each iteration it

1. waits in ``select()`` until a socket is ready, a call is queued, or the owner's deadline;
2. feeds what it read to the owner (``on_data``), and runs the queued calls;
3. fires the owner's timer when its deadline passed;
4. lets the owner write what it has to send (``write_pending``, which calls :meth:`IOLoop.write`).

Everything the owner does happens on this thread, so the sans-IO objects it drives need no
locks (an owner that lets its callers' threads read or write a link for a while pauses the
loop's reads of it, :meth:`IOLoop.pause_reading`, and serializes with its own lock). TLS
runs through :class:`ssl.SSLObject` over memory BIOs, so the upgrade happens at exactly
the byte the core says and bytes read past it (``trailing_data``) are fed to TLS, not lost.
"""

from __future__ import annotations

import contextlib
import errno
import logging
import selectors
import socket
import ssl
import threading
import time
from collections import deque
from collections.abc import Callable
from typing import Any, Protocol

__all__ = ["IOLoop", "LoopCallbacks", "LoopOwner", "LoopSocket"]

_log = logging.getLogger("nsq_sansio.sync.loop")

#: Bytes asked of the kernel per recv(); large reads batch many messages per wake-up.
_RECV_SIZE = 256 * 1024
_READ = selectors.EVENT_READ
_WRITE = selectors.EVENT_WRITE


class LoopOwner(Protocol):
    """What an :class:`IOLoop` calls, always on its own thread."""

    def on_connected(self, link: LoopSocket, now: float) -> None: ...

    def on_data(self, link: LoopSocket, data: bytes, now: float) -> None:
        """``data`` read from the link (plaintext after TLS); ``b""`` means EOF."""

    def on_link_error(self, link: LoopSocket, error: BaseException, now: float) -> None:
        """The connection attempt or the socket failed; the link is already closed."""

    def on_tls_established(self, link: LoopSocket, now: float) -> None: ...

    def write_pending(self) -> None:
        """End of an iteration: write pending output with :meth:`IOLoop.write`."""

    def next_deadline(self) -> float | None: ...

    def handle_timer(self, now: float) -> None: ...


class LoopCallbacks:
    """A :class:`LoopOwner` made of functions, so that the object they belong to keeps them
    private (its public surface is what its users call, not what the loop calls)."""

    __slots__ = (
        "handle_timer",
        "next_deadline",
        "on_connected",
        "on_data",
        "on_link_error",
        "on_tls_established",
        "write_pending",
    )

    def __init__(
        self,
        *,
        on_connected: Callable[[LoopSocket, float], None],
        on_data: Callable[[LoopSocket, bytes, float], None],
        on_link_error: Callable[[LoopSocket, BaseException, float], None],
        on_tls_established: Callable[[LoopSocket, float], None],
        write_pending: Callable[[], None],
        next_deadline: Callable[[], float | None],
        handle_timer: Callable[[float], None],
    ) -> None:
        self.on_connected = on_connected
        self.on_data = on_data
        self.on_link_error = on_link_error
        self.on_tls_established = on_tls_established
        self.write_pending = write_pending
        self.next_deadline = next_deadline
        self.handle_timer = handle_timer


class LoopSocket:
    """One socket the :class:`IOLoop` drives (a TCP connection, maybe TLS): what is queued
    to write, the TLS state, the byte counts. ``key`` is the owner's name for it."""

    __slots__ = (
        "_close_when_flushed",
        "_connect_deadline",
        "_connect_timeout",
        "_connecting",
        "_handshaking",
        "_incoming",
        "_interest",
        "_outgoing",
        "_plain",
        "_reads_paused",
        "_ssl",
        "address",
        "bytes_in",
        "bytes_out",
        "closed",
        "host",
        "key",
        "out",
        "port",
        "sock",
    )

    def __init__(self, key: object, host: str, port: int) -> None:
        self.key = key
        self.host = host
        self.port = port
        self.address = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
        self.sock: socket.socket | None = None
        self.out = bytearray()
        self.closed = False
        #: Wire bytes (after TLS) read from and written to the socket.
        self.bytes_in = 0
        self.bytes_out = 0
        self._connecting = True
        self._close_when_flushed = False
        self._connect_deadline = 0.0
        self._connect_timeout = 0.0
        self._handshaking = False
        self._ssl: ssl.SSLObject | None = None
        self._incoming: ssl.MemoryBIO | None = None
        self._outgoing: ssl.MemoryBIO | None = None
        self._plain = bytearray()  # written during the TLS handshake, sent after it
        self._interest = 0
        self._reads_paused = False

    @property
    def tls(self) -> bool:
        return self._ssl is not None

    @property
    def connecting(self) -> bool:
        """The TCP connect (name resolution included) is still under way."""
        return self._connecting

    @property
    def direct_socket(self) -> socket.socket | None:
        """The socket, when bytes may be sent on it right now without the loop: plain TCP,
        connected, open, nothing queued (so nothing can be overtaken); else None.

        For an owner that writes from its callers' threads: call it and send while holding the
        lock that serializes the owner's callbacks (so :meth:`IOLoop.write` cannot run at the
        same time); what the socket does not take must then go through :meth:`IOLoop.write`.
        """
        if self._ssl is not None or self._connecting or self.closed or self.out:
            return None
        if self._close_when_flushed:
            return None
        return self.sock

    @property
    def ssl_object(self) -> ssl.SSLObject | None:
        return self._ssl

    def __repr__(self) -> str:
        return f"<LoopSocket {self.address} key={self.key!r}{' closed' if self.closed else ''}>"


class IOLoop:
    """A selectors loop on a dedicated thread, driving one owner (a consumer or a producer)."""

    def __init__(self, owner: LoopOwner | LoopCallbacks, *, name: str = "nsq-sync-io") -> None:
        self._owner = owner
        self._name = name
        self._selector = selectors.DefaultSelector()
        self._wake_r, self._wake_w = socket.socketpair()
        self._wake_r.setblocking(False)
        self._wake_w.setblocking(False)
        self._selector.register(self._wake_r, _READ, None)
        self._calls: deque[Callable[[], None]] = deque()
        self._wake_pending = False
        self._links: dict[int, LoopSocket] = {}  # by fileno
        self._connecting: list[LoopSocket] = []
        self._running = False
        self._thread: threading.Thread | None = None
        self._stopped = threading.Event()
        self.failure: BaseException | None = None
        #: Called on the loop thread once the loop has ended and closed its sockets, before
        #: :meth:`wait_stopped` says so, however it ended (stopped from any thread, its own
        #: included, or crashed): what the owner must do once no loop serves it any more.
        self.on_exit: Callable[[], None] | None = None

    # --- any thread ---------------------------------------------------------------------------

    def start(self) -> None:
        self._running = True
        self._thread = threading.Thread(target=self._run, name=self._name, daemon=True)
        self._thread.start()

    @property
    def thread(self) -> threading.Thread | None:
        return self._thread

    def in_loop_thread(self) -> bool:
        return threading.current_thread() is self._thread

    def call_soon(self, fn: Callable[[], None]) -> None:
        """Run ``fn()`` on the loop thread at its next iteration (thread-safe, cheap). An
        exception from ``fn`` is logged and the loop goes on; report it yourself (a future)."""
        self._calls.append(fn)
        self.wake()

    def wake(self) -> None:
        """Interrupt ``select()``; at most one wake-up byte is outstanding."""
        if not self._wake_pending:
            self._wake_pending = True
            with contextlib.suppress(BlockingIOError, OSError):
                self._wake_w.send(b"\0")

    def stop(self, timeout: float | None = 5.0) -> None:
        """Stop the loop, close every socket and join the thread."""
        self._running = False
        self.wake()
        thread = self._thread
        if thread is not None and thread is not threading.current_thread():
            thread.join(timeout)
        if thread is None:
            self._close_all()

    def wait_stopped(self, timeout: float | None = None) -> bool:
        return self._stopped.wait(timeout)

    # --- loop thread --------------------------------------------------------------------------

    def connect(self, key: object, host: str, port: int, timeout: float) -> LoopSocket:
        """Start a non-blocking connection; ``on_connected`` or ``on_link_error`` follows
        (possibly before this returns, for an immediate failure).

        A host name is resolved on a short-lived helper thread, so a slow DNS server never
        stalls this loop (and the heartbeats of the other connections); IP literals connect
        at once. ``timeout`` covers the name resolution and the TCP handshake.
        """
        link = LoopSocket(key, host, port)
        link._connect_timeout = timeout
        link._connect_deadline = time.monotonic() + timeout
        try:
            infos = socket.getaddrinfo(
                host, port, type=socket.SOCK_STREAM, flags=socket.AI_NUMERICHOST
            )
        except socket.gaierror:  # a name, not an address: resolve it off the loop
            self._connecting.append(link)

            def resolve() -> None:
                result: list[Any] | OSError
                try:
                    result = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
                except OSError as exc:
                    result = exc
                self.call_soon(lambda: self._resolved(link, result))

            threading.Thread(target=resolve, name="nsq-sync-resolve", daemon=True).start()
            return link
        except OSError as exc:
            link.closed = True
            self._deliver_error(link, exc)
            return link
        self._open(link, infos[0])
        return link

    def _resolved(self, link: LoopSocket, result: list[Any] | OSError) -> None:
        if link.closed:  # timed out or closed meanwhile
            return
        if link in self._connecting:
            self._connecting.remove(link)
        if isinstance(result, OSError) or not result:
            link.closed = True
            error = result if isinstance(result, OSError) else OSError(f"{link.host}: no address")
            self._deliver_error(link, error)
            return
        self._open(link, result[0])

    def _open(self, link: LoopSocket, info: Any) -> None:
        family, kind, proto, _, sockaddr = info
        try:
            sock = socket.socket(family, kind, proto)
        except OSError as exc:
            link.closed = True
            self._deliver_error(link, exc)
            return
        sock.setblocking(False)
        with contextlib.suppress(OSError):
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        link.sock = sock
        code = sock.connect_ex(sockaddr)
        if code not in (0, errno.EINPROGRESS, errno.EWOULDBLOCK, errno.EAGAIN):
            sock.close()
            link.sock = None
            link.closed = True
            self._deliver_error(
                link,
                ConnectionRefusedError(
                    code, f"connect to {link.address}: {errno.errorcode.get(code, code)}"
                ),
            )
            return
        self._links[sock.fileno()] = link
        self._connecting.append(link)
        link._interest = _WRITE
        self._selector.register(sock, _WRITE, link)

    def start_tls(
        self,
        link: LoopSocket,
        context: ssl.SSLContext,
        server_hostname: str | None,
        trailing: bytes,
    ) -> None:
        """Begin the TLS handshake now; ``on_tls_established`` follows (or ``on_link_error``)."""
        incoming, outgoing = ssl.MemoryBIO(), ssl.MemoryBIO()
        link._incoming, link._outgoing = incoming, outgoing
        link._ssl = context.wrap_bio(
            incoming, outgoing, server_side=False, server_hostname=server_hostname
        )
        link._handshaking = True
        if trailing:
            incoming.write(trailing)
        self._handshake(link, time.monotonic())

    def close_link(self, link: LoopSocket) -> None:
        """Close the socket at once (what was not written is dropped)."""
        if link.closed:
            return
        link.closed = True
        sock = link.sock
        if sock is not None:
            self._links.pop(sock.fileno(), None)
            with contextlib.suppress(KeyError, ValueError, OSError):
                self._selector.unregister(sock)
            with contextlib.suppress(OSError):
                sock.close()
        if link in self._connecting:
            self._connecting.remove(link)

    def close_link_when_flushed(self, link: LoopSocket) -> None:
        """Close the socket once what was written to ``link`` is sent."""
        if link.closed:
            return
        link._close_when_flushed = True
        if not link.out or link._connecting or link._handshaking:
            self.close_link(link)

    def write(self, link: LoopSocket, data: bytes) -> None:
        """Send ``data`` (encrypted when TLS is on); what the socket refuses waits for it."""
        if link.closed or not data:
            return
        if link._handshaking:
            link._plain += data
            return
        if link._ssl is not None:
            assert link._outgoing is not None
            link._ssl.write(data)
            data = link._outgoing.read()
        if link._connecting:
            link.out += data
            return
        if link.out:
            link.out += data
            self._write(link)
            return
        # Fast path: nothing queued, try to send it all now.
        sock = link.sock
        assert sock is not None
        try:
            sent = sock.send(data)
        except (BlockingIOError, InterruptedError):
            sent = 0
        except OSError as exc:
            self._fail(link, exc)
            return
        link.bytes_out += sent
        if sent < len(data):
            link.out += memoryview(data)[sent:]
            self._set_interest(link, _READ | _WRITE)

    def pause_reading(self, link: LoopSocket) -> None:
        """Stop watching ``link`` for reads (loop thread): an owner whose callers read the socket
        themselves for a while (a duplicate descriptor) so the loop does not wake for it.
        Writes queued on the link still go out."""
        link._reads_paused = True
        self._set_interest(link, link._interest)

    def resume_reading(self, link: LoopSocket) -> None:
        """Watch ``link`` for reads again (loop thread)."""
        if link._reads_paused:
            link._reads_paused = False
            self._set_interest(link, _READ | _WRITE if link.out else _READ)

    @property
    def links(self) -> list[LoopSocket]:
        return list(self._links.values())

    def _run(self) -> None:
        try:
            self._loop()
        except BaseException as exc:  # pragma: no cover - a bug in an owner: report, stop
            self.failure = exc
            _log.exception("IO loop %s crashed", self._name)
        finally:
            try:
                self._close_all()
                if self.on_exit is not None:
                    self.on_exit()
            except Exception:  # pragma: no cover - a bug in the owner's hook: the loop ends
                _log.exception("IO loop %s: its exit hook failed", self._name)
            finally:
                self._stopped.set()

    def _loop(self) -> None:
        owner = self._owner
        select = self._selector.select
        calls = self._calls
        wake_r = self._wake_r
        monotonic = time.monotonic
        while self._running:
            now = monotonic()
            deadline = owner.next_deadline()
            if self._connecting:
                first = min(link._connect_deadline for link in self._connecting)
                deadline = first if deadline is None else min(deadline, first)
            if calls:
                timeout: float | None = 0.0
            elif deadline is None:
                timeout = None
            else:
                timeout = max(deadline - now, 0.0)
            ready = select(timeout)
            now = monotonic()
            for key, mask in ready:
                link = key.data
                if link is None:
                    with contextlib.suppress(BlockingIOError, InterruptedError):
                        while wake_r.recv(4096):
                            pass
                    # Cleared only after draining: a wake() racing with us leaves a byte.
                    self._wake_pending = False
                    continue
                if link.closed:
                    continue
                if mask & _WRITE:
                    self._on_writable(link, now)
                if mask & _READ and not link.closed:
                    self._on_readable(link, now)
            while calls:
                call = calls.popleft()
                try:
                    call()
                except Exception:  # a call handed over by user code: never fatal to the loop
                    _log.exception("IO loop %s: a queued call failed: %r", self._name, call)
            if self._connecting:
                self._check_connect_timeouts(now)
            deadline = owner.next_deadline()
            if deadline is not None and monotonic() >= deadline:
                owner.handle_timer(monotonic())
            owner.write_pending()

    def _check_connect_timeouts(self, now: float) -> None:
        for link in list(self._connecting):
            if now >= link._connect_deadline:
                self.close_link(link)
                self._deliver_error(
                    link,
                    TimeoutError(
                        errno.ETIMEDOUT, f"connect timed out after {link._connect_timeout:g} s"
                    ),
                )

    def _set_interest(self, link: LoopSocket, interest: int) -> None:
        if link._reads_paused:
            interest &= ~_READ
        if link._interest != interest and link.sock is not None and not link.closed:
            if not interest:  # paused and nothing to write: not watched at all
                self._selector.unregister(link.sock)
            elif not link._interest:
                self._selector.register(link.sock, interest, link)
            else:
                self._selector.modify(link.sock, interest, link)
            link._interest = interest

    def _on_writable(self, link: LoopSocket, now: float) -> None:
        if link._connecting:
            assert link.sock is not None
            code = link.sock.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR)
            if code:
                self.close_link(link)
                self._deliver_error(
                    link,
                    ConnectionRefusedError(
                        code, f"connect to {link.address}: {errno.errorcode.get(code, code)}"
                    ),
                )
                return
            link._connecting = False
            self._connecting.remove(link)
            self._set_interest(link, _READ | _WRITE if link.out else _READ)
            self._owner.on_connected(link, now)
            return
        if link.out:
            self._write(link)
        else:
            self._set_interest(link, _READ)

    def _write(self, link: LoopSocket) -> None:
        sock = link.sock
        assert sock is not None
        try:
            sent = sock.send(link.out)
        except (BlockingIOError, InterruptedError):
            sent = 0
        except OSError as exc:
            self._fail(link, exc)
            return
        if sent:
            link.bytes_out += sent
            del link.out[:sent]
        if not link.out and link._close_when_flushed:
            self.close_link(link)
            return
        self._set_interest(link, _READ | _WRITE if link.out else _READ)

    def _on_readable(self, link: LoopSocket, now: float) -> None:
        if link._reads_paused:  # paused after select() returned: the owner reads it now
            return
        sock = link.sock
        assert sock is not None
        try:
            data = sock.recv(_RECV_SIZE)
        except (BlockingIOError, InterruptedError):
            return
        except OSError as exc:
            self._fail(link, exc)
            return
        link.bytes_in += len(data)
        if link._ssl is None:
            self._owner.on_data(link, data, now)
            if not data:
                self.close_link(link)
            return
        assert link._incoming is not None
        if data:
            link._incoming.write(data)
        else:
            link._incoming.write_eof()
        if link._handshaking:
            self._handshake(link, now)
            return
        self._read_tls(link, now, eof=not data)

    def _read_tls(self, link: LoopSocket, now: float, eof: bool = False) -> None:
        tls = link._ssl
        assert tls is not None
        chunks: list[bytes] = []
        closed = eof
        while True:
            try:
                piece = tls.read(_RECV_SIZE)
            except ssl.SSLWantReadError:
                break
            except (ssl.SSLZeroReturnError, ssl.SSLEOFError):
                closed = True
                break
            except ssl.SSLError as exc:
                if chunks:
                    self._owner.on_data(link, b"".join(chunks), now)
                self._fail(link, exc)
                return
            if not piece:
                closed = True
                break
            chunks.append(piece)
        if chunks:
            self._owner.on_data(link, b"".join(chunks), now)
        if closed and not link.closed:
            self._owner.on_data(link, b"", now)
            self.close_link(link)
        elif link._outgoing is not None and link._outgoing.pending and not link.closed:
            link.out += link._outgoing.read()  # TLS may answer (key updates, tickets)
            self._write(link)

    def _handshake(self, link: LoopSocket, now: float) -> None:
        tls, outgoing = link._ssl, link._outgoing
        assert tls is not None and outgoing is not None
        try:
            tls.do_handshake()
            done = True
        except ssl.SSLWantReadError:
            done = False
        except (ssl.SSLError, ssl.CertificateError, OSError) as exc:
            if outgoing.pending:
                link.out += outgoing.read()
                self._write(link)
            self._fail(link, exc)
            return
        if outgoing.pending:
            link.out += outgoing.read()
            self._write(link)
        if link.closed or not done:
            return
        link._handshaking = False
        if link._plain:
            plain, link._plain = bytes(link._plain), bytearray()
            self.write(link, plain)
        self._owner.on_tls_established(link, now)
        if not link.closed:
            self._read_tls(link, now)  # application data that came with the last flight

    def _fail(self, link: LoopSocket, error: BaseException) -> None:
        self.close_link(link)
        self._deliver_error(link, error)

    def _deliver_error(self, link: LoopSocket, error: BaseException) -> None:
        self._owner.on_link_error(link, error, time.monotonic())

    def _close_all(self) -> None:
        for link in list(self._links.values()):
            self.close_link(link)
        with contextlib.suppress(Exception):
            self._selector.close()
        for sock in (self._wake_r, self._wake_w):
            with contextlib.suppress(OSError):
                sock.close()
