"""nsqd's protocol V2, server side: the commands clients send and how nsqd answers them
(nsqd's ``protocol_v2.go``).

:meth:`ProtocolV2.process` runs every complete command in a client's input: the magic, then
IDENTIFY (negotiation, TLS and compression upgrades), AUTH, SUB, RDY, FIN, REQ, TOUCH, CLS,
NOP, PUB, MPUB and DPUB, with nsqd's checks, error codes and texts. A PUB to an existing topic
whose body is all there, and a FIN of a message the client owns, take a fast path. Deliveries
that a chunk of commands allows are made once, when the chunk is done. The per-client timer
(protocol magic timeout, heartbeats, missed heartbeats, AUTH expiry, back-pressure polls) is
here too, as it is in nsqd's ``IOLoop`` and ``messagePump``. Topics and channels do the queue
work (:mod:`.topic`, :mod:`.channel`); this module only speaks the protocol.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

from ..errors import CompressionError, InvalidName, LocalProtocolError, ServerError
from ..names import validate_channel, validate_topic
from .backend import BackendError
from .channel import RESUME_POLL, RESUME_POLL_MAX, Channel
from .client import Client
from .context import INF, NodeContext
from .events import AuthRequested, ServerEvent, StartTLS
from .identify import apply_identify, negotiate, parse_identify
from .message import Message
from .options import AuthRequest, AuthState, NSQDOptions
from .states import ClientState
from .topic import ChannelLookup, Topic
from .topics import Topics
from .wire import (
    BODY_COMMANDS,
    CLOSE_WAIT,
    FRAME_ERROR,
    FRAME_RESPONSE,
    HEARTBEAT,
    I32,
    MAGIC_V2,
    OK,
    ClientError,
    base10,
    frame,
    go_quote,
    text,
)

__all__ = ["READ_STEP_COMMANDS", "STEP_COMMANDS", "STEP_INPUT_BYTES", "ProtocolV2"]

# Bound once: a method called on an imported name compiles to a slower attribute load (3.11).
_unpack_i32 = I32.unpack_from

# A client's input is run in bounded steps: at most this many commands and this many
# decompressed bytes per step (one where the bytes arrive, the rest one per handle_timer call,
# clients taking turns), so one client cannot hold the node: 64 KiB of deflate can stand for
# 16 million NOPs. A step of 1024 commands takes about a millisecond. The step where bytes
# arrive may run READ_STEP_COMMANDS: a 64 KiB read of FINs (3,120) is then one step, as it was
# before steps (splitting it cost a consumer's FIN path 4% in bench); what a read expands to
# beyond that (compressed input) goes in the smaller steps.
STEP_COMMANDS = 1024
READ_STEP_COMMANDS = 4096
STEP_INPUT_BYTES = 256 * 1024


class ProtocolV2:
    """The protocol V2 server side of one node, over its :class:`Topics` (see the module)."""

    def __init__(self, options: NSQDOptions, context: NodeContext, topics: Topics) -> None:
        self.options = options
        self._context = context
        self._topics = topics
        self._dirty = context.dirty
        self._ids = context.ids
        # Topics that got messages from the input being processed: pumped once at its end.
        self._touched: dict[Topic, None] = {}
        # Channels where a FIN freed room for more: pumped once at the end of the input.
        self._freed: dict[Channel[Client], None] = {}
        # Clients whose input is not all processed yet, in turn order (see step_pending_input).
        self.input_pending: dict[Client, None] = {}
        self._fast_path = not options.tls_required and not options.auth_enabled
        self._heartbeat_frame = frame(FRAME_RESPONSE, HEARTBEAT)
        self.ok_frame = frame(FRAME_RESPONSE, OK)
        self._handlers: dict[bytes, Callable[[Client, list[bytes], float, list[ServerEvent]], None]]
        self._handlers = {
            b"FIN": self._cmd_fin,
            b"RDY": self._cmd_rdy,
            b"REQ": self._cmd_req,
            b"NOP": self._cmd_nop,
            b"TOUCH": self._cmd_touch,
            b"SUB": self._cmd_sub,
            b"CLS": self._cmd_cls,
        }

    # ------------------------------------------------------------------ what the node calls

    def receive(self, conn: Client, data: bytes, now: float, events: list[ServerEvent]) -> None:
        """Bytes read from a live connection (``b""`` = EOF): run a bounded step of what they
        complete (the rest waits in :attr:`input_pending` for :meth:`step_input`)."""
        if not data:
            self._topics.close_client(conn, "client closed the connection", None, now, events)
            return
        if conn.state is ClientState.TLS_HANDSHAKE:
            raise LocalProtocolError(
                f"connection {conn.id} is in the TLS handshake: feed bytes to TLS, "
                "then call tls_established()"
            )
        if conn.decoder is not None:
            # Decompressed lazily, a bounded piece per step: a few KiB of deflate can stand
            # for gigabytes of commands.
            conn.compressed.append(data)
            conn.compressed_len += len(data)
        else:
            conn.inbuf += data
        if conn.state is ClientState.AUTHENTICATING or conn.lookup_id:
            # Input waits for the auth answer (or nsqlookupd), within the bound of one
            # command (a transport stops reading meanwhile: see NSQD.input_pending).
            limit = self.options.max_body_size + self.options.max_command_line + 8
            if len(conn.inbuf) + conn.compressed_len > limit:
                waiting = "AUTH" if conn.lookup_id == 0 else "nsqlookupd"
                self._topics.close_client(
                    conn, f"too much input while waiting for {waiting}", None, now, events
                )
            return
        self.step(conn, now, events, READ_STEP_COMMANDS)

    def step(
        self, conn: Client, now: float, events: list[ServerEvent], budget: int = STEP_COMMANDS
    ) -> None:
        """One bounded step of a client's input: at most ``budget`` commands and about
        ``STEP_INPUT_BYTES`` decompressed bytes. What is left keeps the client in
        :attr:`input_pending`, for the node's next ``handle_timer`` call."""
        pulled = 0
        # Decompress more only when what is decompressed cannot make a step (the first time)
        # or did not hold a whole command (afterwards): the input buffer stays within about
        # one command and one piece.
        wanted = len(conn.inbuf) < STEP_INPUT_BYTES
        while True:
            if wanted and conn.decoder is not None and (conn.pieces or conn.compressed):
                taken = self._inflate(conn, now, events)
                if taken < 0:
                    break  # a corrupt stream: the client is closed
                pulled += taken
            wanted = True
            budget = self.process(conn, now, events, budget)
            state = conn.state
            if (
                state is ClientState.CLOSED
                or state is ClientState.TLS_HANDSHAKE
                or state is ClientState.AUTHENTICATING
                or conn.lookup_id
            ):
                break  # nothing runs until the handshake, the auth or lookupd answer is in
            if budget <= 0:
                self._more_input(conn)
                return
            if conn.pieces is None and not conn.compressed:
                break  # every byte read is parsed: the rest of a command is still to come
            if pulled >= STEP_INPUT_BYTES:
                self._more_input(conn)
                return
        if conn.more_input:
            conn.more_input = False
            self.input_pending.pop(conn, None)

    def _more_input(self, conn: Client) -> None:
        if not conn.more_input:
            conn.more_input = True
            self.input_pending[conn] = None

    def step_pending_input(self, now: float, events: list[ServerEvent]) -> None:
        """One step of the client whose turn it is (clients with input left take turns)."""
        pending = self.input_pending
        while pending:
            conn = next(iter(pending))
            del pending[conn]  # back at the end of the line if it has more
            if not conn.more_input or conn.state is ClientState.CLOSED:
                conn.more_input = False
                continue
            conn.more_input = False
            self.step(conn, now, events)
            return

    def auth_result(
        self, conn: Client, state: AuthState | None, now: float, events: list[ServerEvent]
    ) -> None:
        """The transport's answer to an :class:`AuthRequested` for a live connection."""
        if conn.state is ClientState.AUTHENTICATING:
            conn.state = ClientState.INIT
            try:
                self._apply_auth(conn, state, now)
            except ClientError as err:
                self._client_error(conn, err, now, events)
                return
            self.step(conn, now, events)
        elif conn.auth_refreshing:
            conn.auth_refreshing = False
            if state is None:
                self._client_error(conn, ClientError("E_AUTH_FAILED", "AUTH failed"), now, events)
            else:
                conn.auth = state
                conn.auth_expires = now + state.ttl
                self._context.arm(conn, conn.auth_expires)
        else:
            raise LocalProtocolError(
                f"auth_result() for connection {conn.id} in state {conn.state.value}, "
                "which has no AUTH waiting"
            )

    def tls_established(self, conn: Client, now: float, events: list[ServerEvent]) -> None:
        """The TLS handshake IDENTIFY asked for is done: answer ``OK`` and go on."""
        if conn.state is not ClientState.TLS_HANDSHAKE:
            raise LocalProtocolError(
                f"tls_established() for connection {conn.id} in state {conn.state.value}, "
                "which is not waiting for a TLS handshake"
            )
        conn.state = ClientState.INIT
        conn.tls = True
        conn.last_read = now
        self._write(conn, self.ok_frame)
        pending = conn.pending_compression
        if pending is not None:
            conn.pending_compression = None
            self._enable_compression(conn, pending[0], pending[1])
        if conn.inbuf or conn.compressed or conn.pieces is not None:
            self.step(conn, now, events)

    # ------------------------------------------------------------------ input processing

    def _inflate(self, conn: Client, now: float, events: list[ServerEvent]) -> int:
        """Move one decompressed piece into ``conn.inbuf``; its size, or -1 when the stream
        is corrupt (the client is then closed)."""
        try:
            while True:
                pieces = conn.pieces
                if pieces is None:
                    if not conn.compressed:
                        return 0
                    chunk = conn.compressed.popleft()
                    conn.compressed_len -= len(chunk)
                    pieces = conn.pieces = conn.decoder.decompress_iter(chunk)
                piece = next(pieces, None)
                if piece is None:
                    conn.pieces = None
                    continue
                conn.inbuf += piece
                return len(piece)
        except CompressionError as exc:
            conn.pieces = None
            self._topics.close_client(
                conn, f"bad compressed stream from client: {exc}", None, now, events
            )
            return -1

    def process(self, conn: Client, now: float, events: list[ServerEvent], budget: int) -> int:
        """Run the complete commands in ``conn.inbuf``, at most ``budget`` of them; returns
        the budget left (0 or less: it stopped at the budget)."""
        if conn.lookup_id:
            return budget  # waiting for nsqlookupd: see release_from_lookup
        buf = conn.inbuf
        pos = 0
        max_line = self.options.max_command_line
        fast_path = self._fast_path
        started = self._topics.started
        max_msg_size = self.options.max_msg_size
        topics = self._topics.by_name
        touched = self._touched
        freed = self._freed
        subscribed = ClientState.SUBSCRIBED
        try:
            while budget > 0:
                state = conn.state
                if (
                    state is ClientState.CLOSED
                    or state is ClientState.TLS_HANDSHAKE
                    or state is ClientState.AUTHENTICATING
                ):
                    break
                end = len(buf)
                if state is ClientState.AWAITING_MAGIC:
                    if end - pos < 4:
                        break
                    magic = bytes(buf[pos : pos + 4])
                    pos += 4
                    if magic != MAGIC_V2:
                        error = ServerError("E_BAD_PROTOCOL", "")
                        self._write_frame(conn, FRAME_ERROR, b"E_BAD_PROTOCOL")
                        self._topics.close_client(
                            conn, f"bad protocol magic {magic!r}", error, now, events
                        )
                        break
                    conn.state = ClientState.INIT
                    conn.last_read = now
                    self._arm_conn(conn)
                    continue
                try:
                    verb = conn.pending_verb
                    if verb is None:
                        newline = buf.find(b"\n", pos)
                        if newline < 0 or newline - pos > max_line:
                            if newline >= 0 or end - pos > max_line:
                                self._topics.close_client(
                                    conn,
                                    f"command line longer than {max_line} bytes",
                                    None,
                                    now,
                                    events,
                                )
                            break
                        line = bytes(buf[pos:newline])
                        pos = newline + 1
                        budget -= 1
                        if line[-1:] == b"\r":
                            line = line[:-1]
                        conn.last_read = now
                        if fast_path and line[:4] == b"PUB " and end - pos >= 4:
                            # The common case in one step: a PUB to an existing topic whose
                            # body is all here (anything else takes the general path).
                            topic = topics.get(line[4:].decode("ascii", "replace"))
                            size = _unpack_i32(buf, pos)[0]
                            if topic is not None and 0 < size <= max_msg_size:
                                start = pos + 4
                                if end - start >= size:
                                    pos = start + size
                                    self._publish_one(conn, topic, bytes(buf[start:pos]), now)
                                    continue
                        elif (
                            line[:4] == b"FIN "
                            and len(line) == 20
                            and conn.state is subscribed
                            and fast_path
                        ):
                            channel = conn.channel
                            msg = None if channel is None else channel.in_flight.get(line[4:])
                            if channel is not None and msg is not None and msg.owner == conn.id:
                                if channel.finish(conn, msg):
                                    freed[channel] = None
                                continue
                        mark = len(conn.out)
                        self._command(conn, line.split(b" "), now, events)
                        if started and self._wait_for_lookup(conn, started[-1], mark):
                            break
                        continue
                    if conn.pending_size < 0:
                        if end - pos < 4:
                            break
                        size = _unpack_i32(buf, pos)[0]
                        pos += 4
                        self._check_body_size(verb, size)
                        conn.pending_size = size
                    size = conn.pending_size
                    if end - pos < size:
                        break
                    body = bytes(buf[pos : pos + size])
                    pos += size
                    params = conn.pending_params
                    conn.pending_verb = None
                    conn.pending_params = []
                    conn.pending_size = -1
                    mark = len(conn.out)
                    self._body_command(conn, verb, params, body, now, events)
                    if started and self._wait_for_lookup(conn, started[-1], mark):
                        break
                except ClientError as err:
                    conn.pending_verb = None
                    conn.pending_params = []
                    conn.pending_size = -1
                    if started:
                        started[-1].claimed = True  # the topic exists; the error is the answer
                    self._client_error(conn, err, now, events)
                    continue
                if conn.switch_input:
                    # Compression starts right after IDENTIFY: what follows is compressed
                    # (the caller decompresses it, a bounded piece at a time).
                    conn.switch_input = False
                    rest = bytes(buf[pos:])
                    del buf[:]
                    pos = 0
                    if rest:
                        conn.compressed.appendleft(rest)
                        conn.compressed_len += len(rest)
                    break
                if conn.state is ClientState.TLS_HANDSHAKE:
                    trailing = bytes(buf[pos:])
                    pos = len(buf)
                    events.append(StartTLS(conn.id, trailing))
                    break
        finally:
            del buf[:pos]
            if touched:
                for topic in list(touched):
                    topic.pump(now)
                touched.clear()
            if freed:
                for channel in list(freed):
                    channel.pump(now)
                freed.clear()
        return budget

    def _wait_for_lookup(self, conn: Client, lookup: ChannelLookup, mark: int) -> bool:
        """After a command: when it created a topic that asks nsqlookupd for its channels,
        the client waits for the answer, as nsqd's command blocks in ``GetTopic``: the
        command's answer (written since ``mark``) and the rest of its input are held until
        :meth:`release_from_lookup`. The command's messages are in the topic already, held
        there, so none is lost or reordered meanwhile. True when the client now waits."""
        if lookup.claimed:
            return False
        lookup.claimed = True
        if conn.state is ClientState.CLOSED:
            return False
        out = conn.out
        held = out[mark:]
        del out[mark:]
        conn.out_len -= sum(len(frame_) for frame_ in held)
        conn.held_out = held
        conn.lookup_id = lookup.id
        lookup.waiters.append(conn)
        return True

    def release_from_lookup(self, conn: Client, now: float, events: list[ServerEvent]) -> None:
        """nsqlookupd answered (or the lookup timed out): the client gets the held answer
        and its input runs again (a bounded step now, the rest from the timer)."""
        if not conn.lookup_id:
            return
        conn.lookup_id = 0
        held, conn.held_out = conn.held_out, []
        if conn.state is ClientState.CLOSED:
            return
        for data in held:
            self._write(conn, data)
        conn.last_read = now  # nsqd reads again only now: its read deadline starts over
        self._arm_conn(conn)
        if conn.inbuf or conn.compressed or conn.pieces is not None:
            self.step(conn, now, events)

    def _client_error(
        self, conn: Client, err: ClientError, now: float, events: list[ServerEvent]
    ) -> None:
        text = f"{err.code} {err.text}".encode()
        self._write_frame(conn, FRAME_ERROR, text)
        if err.fatal:
            self._topics.close_client(
                conn,
                f"fatal error: {err.code} {err.text}",
                ServerError(err.code, err.text),
                now,
                events,
            )

    def _command(
        self, conn: Client, params: list[bytes], now: float, events: list[ServerEvent]
    ) -> None:
        verb = params[0]
        if verb != b"IDENTIFY" and self.options.tls_required and not conn.tls:
            raise ClientError("E_INVALID", f"cannot {text(verb)} in current state (TLS required)")
        handler = self._handlers.get(verb)
        if handler is not None:
            handler(conn, params, now, events)
            return
        if verb in BODY_COMMANDS:
            self._before_body(conn, verb, params, now)
            conn.pending_verb = verb
            conn.pending_params = params
            conn.pending_size = -1
            return
        raise ClientError("E_INVALID", f"invalid command {text(verb)}")

    def _before_body(self, conn: Client, verb: bytes, params: list[bytes], now: float) -> None:
        """nsqd's checks that come before it reads a command's body."""
        if verb == b"PUB":
            if len(params) < 2:
                raise ClientError("E_INVALID", "PUB insufficient number of parameters")
            self._topic_param("PUB", params[1])
        elif verb == b"MPUB":
            if len(params) < 2:
                raise ClientError("E_INVALID", "MPUB insufficient number of parameters")
            topic = self._topic_param("MPUB", params[1])
            self._check_auth(conn, "MPUB", topic, "", now)
        elif verb == b"DPUB":
            if len(params) < 3:
                raise ClientError("E_INVALID", "DPUB insufficient number of parameters")
            self._topic_param("DPUB", params[1])
            timeout_ms = base10(params[2])
            if timeout_ms is None:
                raise ClientError("E_INVALID", f"DPUB could not parse timeout {text(params[2])}")
            max_ms = int(self.options.effective_max_defer_timeout * 1000)
            if timeout_ms > max_ms:
                raise ClientError("E_INVALID", f"DPUB timeout {timeout_ms} out of range 0-{max_ms}")
        elif verb == b"IDENTIFY":
            if conn.state is not ClientState.INIT:
                raise ClientError("E_INVALID", "cannot IDENTIFY in current state")
        elif verb == b"AUTH":
            if conn.state is not ClientState.INIT:
                raise ClientError("E_INVALID", "cannot AUTH in current state")
            if len(params) != 1:
                raise ClientError("E_INVALID", "AUTH invalid number of parameters")

    def _check_body_size(self, verb: bytes, size: int) -> None:
        options = self.options
        if verb == b"PUB" or verb == b"DPUB":
            name = verb.decode()
            if size <= 0:
                raise ClientError("E_BAD_MESSAGE", f"{name} invalid message body size {size}")
            if size > options.max_msg_size:
                raise ClientError(
                    "E_BAD_MESSAGE", f"{name} message too big {size} > {options.max_msg_size}"
                )
        elif verb == b"MPUB":
            if size <= 0:
                raise ClientError("E_BAD_BODY", f"MPUB invalid body size {size}")
            if size > options.max_body_size:
                raise ClientError(
                    "E_BAD_BODY", f"MPUB body too big {size} > {options.max_body_size}"
                )
        else:  # IDENTIFY, AUTH
            name = verb.decode()
            if size > options.max_body_size:
                raise ClientError(
                    "E_BAD_BODY", f"{name} body too big {size} > {options.max_body_size}"
                )
            if size <= 0:
                raise ClientError("E_BAD_BODY", f"{name} invalid body size {size}")

    def _body_command(
        self,
        conn: Client,
        verb: bytes,
        params: list[bytes],
        body: bytes,
        now: float,
        events: list[ServerEvent],
    ) -> None:
        if verb == b"PUB":
            self._cmd_pub(conn, params, body, now)
        elif verb == b"MPUB":
            self._cmd_mpub(conn, params, body, now)
        elif verb == b"DPUB":
            self._cmd_dpub(conn, params, body, now)
        elif verb == b"IDENTIFY":
            self._cmd_identify(conn, body, now)
        else:
            self._cmd_auth(conn, body, now, events)

    def _topic_param(self, command: str, raw: bytes) -> str:
        try:
            name = raw.decode("ascii")
        except UnicodeDecodeError:
            name = ""
        if name in self._topics.by_name:
            return name
        try:
            return validate_topic(name)
        except InvalidName:
            raise ClientError(
                "E_BAD_TOPIC",
                f"{'E_BAD_TOPIC ' if command == 'MPUB' else ''}{command} topic name "
                f"{go_quote(raw)} is not valid",
            ) from None

    # ------------------------------------------------------------------ commands

    def _cmd_identify(self, conn: Client, body: bytes, now: float) -> None:
        data = parse_identify(body)
        apply_identify(conn, data, self.options, now)
        self._arm_conn(conn)
        if not data.feature_negotiation:
            self._write(conn, self.ok_frame)
            return
        answer, tls, compression = negotiate(conn, data, self.options)
        self._write_frame(conn, FRAME_RESPONSE, json.dumps(answer, separators=(",", ":")).encode())
        if tls:
            conn.state = ClientState.TLS_HANDSHAKE
            conn.pending_compression = compression
        elif compression is not None:
            self._enable_compression(conn, compression[0], compression[1])
            conn.switch_input = True

    def _enable_compression(self, conn: Client, kind: str, level: int) -> None:
        from ..compression import DeflateCodec, SnappyCodec

        # What is already queued was produced before the upgrade and goes out uncompressed.
        if conn.out:
            conn.raw_prefix += b"".join(conn.out)
            conn.out.clear()
            conn.out_len = 0
        codec: Any = SnappyCodec() if kind == "snappy" else DeflateCodec(level)
        conn.encoder = codec
        conn.decoder = codec
        if kind == "snappy":
            conn.snappy = True
        else:
            conn.deflate = True
            conn.deflate_level = level
        self._write(conn, self.ok_frame)

    @staticmethod
    def _auth_request(conn: Client, secret: str) -> AuthRequest:
        host = conn.remote_address.rsplit(":", 1)[0] if ":" in conn.remote_address else ""
        return AuthRequest(remote_ip=host.strip("[]"), tls=conn.tls, secret=secret)

    def _query_auth(self, conn: Client, secret: str) -> AuthState | None:
        check = self.options.auth_check
        if check is None:
            return None
        try:
            result = check(self._auth_request(conn, secret))
        except Exception:
            return None
        return result if isinstance(result, AuthState) else None

    def _cmd_auth(self, conn: Client, body: bytes, now: float, events: list[ServerEvent]) -> None:
        if conn.auth is not None and conn.auth.authorizations:
            raise ClientError("E_INVALID", "AUTH already set")
        if not self.options.auth_enabled:
            raise ClientError("E_AUTH_DISABLED", "AUTH disabled")
        secret = body.decode("utf-8", "replace")
        conn.auth_secret = secret
        if self.options.auth_by_transport:
            conn.state = ClientState.AUTHENTICATING
            events.append(AuthRequested(conn.id, self._auth_request(conn, secret)))
            return
        self._apply_auth(conn, self._query_auth(conn, secret), now)

    def _apply_auth(self, conn: Client, state: AuthState | None, now: float) -> None:
        """Answer AUTH from the auth server's verdict (nsqd's checks and texts)."""
        if state is None:
            raise ClientError("E_AUTH_FAILED", "AUTH failed")
        conn.auth = state
        conn.auth_expires = now + state.ttl
        if self.options.auth_by_transport:
            self._context.arm(conn, conn.auth_expires)
        if not state.authorizations:
            raise ClientError("E_UNAUTHORIZED", "AUTH no authorizations found")
        answer = {
            "identity": state.identity,
            "identity_url": state.identity_url,
            "permission_count": len(state.authorizations),
        }
        self._write_frame(conn, FRAME_RESPONSE, json.dumps(answer, separators=(",", ":")).encode())

    def _check_auth(self, conn: Client, command: str, topic: str, channel: str, now: float) -> None:
        if not self.options.auth_enabled:
            return
        state = conn.auth
        if state is None or not state.authorizations:
            raise ClientError("E_AUTH_FIRST", f"AUTH required before {command}")
        if now >= conn.auth_expires and not self.options.auth_by_transport:
            refreshed = self._query_auth(conn, conn.auth_secret)
            if refreshed is None:
                raise ClientError("E_AUTH_FAILED", "AUTH failed")
            conn.auth = state = refreshed
            conn.auth_expires = now + refreshed.ttl
        if not state.allows(topic, channel):
            raise ClientError(
                "E_UNAUTHORIZED",
                f"AUTH failed for {command} on {go_quote(topic)} {go_quote(channel)}",
            )

    def _cmd_sub(
        self, conn: Client, params: list[bytes], now: float, events: list[ServerEvent]
    ) -> None:
        if conn.state is not ClientState.INIT:
            raise ClientError("E_INVALID", "cannot SUB in current state")
        if conn.heartbeat_interval <= 0:
            raise ClientError("E_INVALID", "cannot SUB with heartbeats disabled")
        if len(params) < 3:
            raise ClientError("E_INVALID", "SUB insufficient number of parameters")
        topic_name = self._topic_param("SUB", params[1])
        try:
            channel_name = validate_channel(params[2].decode("ascii"))
        except (UnicodeDecodeError, InvalidName):
            raise ClientError(
                "E_BAD_CHANNEL", f"SUB channel name {go_quote(params[2])} is not valid"
            ) from None
        self._check_auth(conn, "SUB", topic_name, channel_name, now)
        topic = self._topics.get_topic(topic_name, now)
        channel = self._topics.get_channel(topic, channel_name, now)
        limit = self.options.max_channel_consumers
        if limit and len(channel.clients) >= limit:
            raise ClientError(
                "E_SUB_FAILED",
                f"SUB failed consumers for {topic_name}:{channel_name} exceeds limit of {limit}",
            )
        channel.clients[conn.id] = conn
        conn.channel = channel
        conn.state = ClientState.SUBSCRIBED
        self._write(conn, self.ok_frame)

    def _cmd_rdy(
        self, conn: Client, params: list[bytes], now: float, events: list[ServerEvent]
    ) -> None:
        state = conn.state
        if state is ClientState.CLOSING:
            return
        if state is not ClientState.SUBSCRIBED:
            raise ClientError("E_INVALID", "cannot RDY in current state")
        count = 1
        if len(params) > 1:
            parsed = base10(params[1])
            if parsed is None:
                raise ClientError("E_INVALID", f"RDY could not parse count {text(params[1])}")
            count = parsed
        max_rdy = self.options.max_rdy_count
        if count > max_rdy:
            raise ClientError("E_INVALID", f"RDY count {count} out of range 0-{max_rdy}")
        conn.ready_count = count
        channel = conn.channel
        if channel is not None and conn.in_flight < count:
            channel.enqueue_ready(conn)
            channel.pump(now)

    def _in_flight_command(
        self, conn: Client, params: list[bytes], command: str, min_params: int
    ) -> tuple[Channel[Client], bytes]:
        state = conn.state
        channel = conn.channel
        if (
            state is not ClientState.SUBSCRIBED and state is not ClientState.CLOSING
        ) or channel is None:
            raise ClientError("E_INVALID", f"cannot {command} in current state")
        if len(params) < min_params:
            raise ClientError("E_INVALID", f"{command} insufficient number of params")
        message_id = params[1]
        if len(message_id) != 16:
            raise ClientError("E_INVALID", "invalid message ID")
        return channel, message_id

    def _cmd_fin(
        self, conn: Client, params: list[bytes], now: float, events: list[ServerEvent]
    ) -> None:
        channel, message_id = self._in_flight_command(conn, params, "FIN", 2)
        msg = channel.owned_in_flight(conn, message_id)
        if isinstance(msg, str):
            raise ClientError("E_FIN_FAILED", f"FIN {text(message_id)} failed {msg}", fatal=False)
        if channel.finish(conn, msg):
            self._freed[channel] = None

    def _cmd_req(
        self, conn: Client, params: list[bytes], now: float, events: list[ServerEvent]
    ) -> None:
        channel, message_id = self._in_flight_command(conn, params, "REQ", 3)
        timeout_ms = base10(params[2])
        if timeout_ms is None:
            raise ClientError("E_INVALID", f"REQ could not parse timeout {text(params[2])}")
        timeout = min(timeout_ms / 1000, self.options.max_req_timeout)
        msg = channel.owned_in_flight(conn, message_id)
        if isinstance(msg, str):
            raise ClientError("E_REQ_FAILED", f"REQ {text(message_id)} failed {msg}", fatal=False)
        channel.requeue(conn, msg, timeout, now)

    def _cmd_touch(
        self, conn: Client, params: list[bytes], now: float, events: list[ServerEvent]
    ) -> None:
        channel, message_id = self._in_flight_command(conn, params, "TOUCH", 2)
        msg = channel.owned_in_flight(conn, message_id)
        if isinstance(msg, str):
            raise ClientError(
                "E_TOUCH_FAILED", f"TOUCH {text(message_id)} failed {msg}", fatal=False
            )
        channel.touch(conn, msg, self.options.max_msg_timeout, now)

    def _cmd_cls(
        self, conn: Client, params: list[bytes], now: float, events: list[ServerEvent]
    ) -> None:
        if conn.state is not ClientState.SUBSCRIBED:
            raise ClientError("E_INVALID", "cannot CLS in current state")
        conn.ready_count = 0
        conn.state = ClientState.CLOSING
        self._write_frame(conn, FRAME_RESPONSE, CLOSE_WAIT)

    def _cmd_nop(
        self, conn: Client, params: list[bytes], now: float, events: list[ServerEvent]
    ) -> None:
        return None

    def _cmd_pub(self, conn: Client, params: list[bytes], body: bytes, now: float) -> None:
        topic_name = self._topic_param("PUB", params[1])
        self._check_auth(conn, "PUB", topic_name, "", now)
        self._publish_one(conn, self._topics.get_topic(topic_name, now), body, now)

    def _publish_one(self, conn: Client, topic: Topic, body: bytes, now: float) -> None:
        """PUB's work once checked; deliveries happen when the input chunk is done."""
        self._touched[topic] = None
        try:
            topic.put(Message(self._ids.new_id(), body, self._context.timestamp(now)), now)
        except BackendError as exc:
            raise ClientError("E_PUB_FAILED", f"PUB failed {exc}") from None
        counts = conn.pub_counts
        name = topic.name
        counts[name] = counts.get(name, 0) + 1
        conn.out.append(self.ok_frame)
        conn.out_len += 10
        self._dirty[conn.id] = None

    def _cmd_dpub(self, conn: Client, params: list[bytes], body: bytes, now: float) -> None:
        topic_name = self._topic_param("DPUB", params[1])
        timeout_ms = base10(params[2]) or 0
        self._check_auth(conn, "DPUB", topic_name, "", now)
        topic = self._topics.get_topic(topic_name, now)
        msg = Message(self._ids.new_id(), body, self._context.timestamp(now), 0, timeout_ms / 1000)
        self._touched[topic] = None
        try:
            topic.put(msg, now)
        except BackendError as exc:
            raise ClientError("E_DPUB_FAILED", f"DPUB failed {exc}") from None
        conn.pub_counts[topic_name] = conn.pub_counts.get(topic_name, 0) + 1
        self._write(conn, self.ok_frame)

    def _cmd_mpub(self, conn: Client, params: list[bytes], body: bytes, now: float) -> None:
        topic_name = self._topic_param("MPUB", params[1])
        bodies = self._split_mpub(body)  # before the topic is made, as in nsqd
        topic = self._topics.get_topic(topic_name, now)
        timestamp = self._context.timestamp(now)
        self._touched[topic] = None
        try:
            for part in bodies:
                topic.put(Message(self._ids.new_id(), part, timestamp), now)
        except BackendError as exc:
            raise ClientError("E_MPUB_FAILED", f"MPUB failed {exc}") from None
        conn.pub_counts[topic_name] = conn.pub_counts.get(topic_name, 0) + len(bodies)
        self._write(conn, self.ok_frame)

    def _split_mpub(self, body: bytes) -> list[bytes]:
        options = self.options
        end = len(body)
        if end < 4:
            raise ClientError("E_BAD_BODY", "MPUB failed to read message count")
        count = _unpack_i32(body, 0)[0]
        max_messages = (options.max_body_size - 4) // 5
        if count <= 0 or count > max_messages:
            raise ClientError("E_BAD_BODY", f"MPUB invalid message count {count}")
        bodies: list[bytes] = []
        pos = 4
        max_size = options.max_msg_size
        for index in range(count):
            if end - pos < 4:
                raise ClientError(
                    "E_BAD_MESSAGE", f"MPUB failed to read message({index}) body size"
                )
            size = _unpack_i32(body, pos)[0]
            pos += 4
            if size <= 0:
                raise ClientError(
                    "E_BAD_MESSAGE", f"MPUB invalid message({index}) body size {size}"
                )
            if size > max_size:
                raise ClientError("E_BAD_MESSAGE", f"MPUB message too big {size} > {max_size}")
            if end - pos < size:
                raise ClientError("E_BAD_MESSAGE", "MPUB failed to read message body")
            bodies.append(body[pos : pos + size])
            pos += size
        if pos != end:
            raise ClientError(
                "E_BAD_BODY", f"MPUB body size {end} does not match its messages ({pos} bytes)"
            )
        return bodies

    # ------------------------------------------------------------------ the client's timer

    def client_timer(self, conn: Client, now: float, events: list[ServerEvent]) -> None:
        """What is due for one client: the magic's timeout, a back-pressure poll, an AUTH
        refresh, a heartbeat to send or a client that missed two."""
        state = conn.state
        if state is ClientState.CLOSED:
            return
        delay = conn.poll_delay
        if delay:
            # Back-pressure poll: output was taken since the last one (keep coming back
            # soon), or the client is still held back (back off), or it is over (stop).
            if conn.took:
                conn.took = False
                delay = RESUME_POLL
            elif conn.blocked:
                delay = min(delay * 2, RESUME_POLL_MAX)
            else:
                delay = 0.0
            conn.poll_delay = delay
            if delay:
                self._context.arm(conn, now + delay)
        if state is ClientState.AWAITING_MAGIC:
            limit = conn.connected_at + self.options.client_timeout
            if now >= limit:
                self._topics.close_client(
                    conn, "timed out waiting for the protocol magic", None, now, events
                )
            else:
                self._context.arm(conn, limit)
            return
        if (
            self.options.auth_by_transport
            and conn.auth is not None
            and not conn.auth_refreshing
            and state is not ClientState.AUTHENTICATING
        ):
            if now >= conn.auth_expires:
                conn.auth_refreshing = True
                request = self._auth_request(conn, conn.auth_secret)
                events.append(AuthRequested(conn.id, request, refresh=True))
            else:
                self._context.arm(conn, conn.auth_expires)
        heartbeat = conn.heartbeat_interval
        if heartbeat <= 0:
            return
        read_deadline = conn.last_read + 2 * heartbeat
        if conn.lookup_id:
            # nsqd is not reading this client while its command waits for nsqlookupd (a
            # bounded wait): no read deadline meanwhile, as in nsqd; heartbeats go on
            read_deadline = INF
        elif now >= read_deadline:
            self._topics.close_client(
                conn, f"no command for {2 * heartbeat:g}s (missed heartbeats)", None, now, events
            )
            return
        if now >= conn.next_heartbeat:
            if state is not ClientState.TLS_HANDSHAKE:
                self._write(conn, self._heartbeat_frame)
            conn.next_heartbeat += heartbeat
            if conn.next_heartbeat <= now:
                conn.next_heartbeat = now + heartbeat
        self._context.arm(conn, min(conn.next_heartbeat, read_deadline))

    def _arm_conn(self, conn: Client) -> None:
        heartbeat = conn.heartbeat_interval
        if heartbeat > 0:
            self._context.arm(conn, min(conn.next_heartbeat, conn.last_read + 2 * heartbeat))

    # ------------------------------------------------------------------ output

    def _write(self, conn: Client, data: bytes) -> None:
        conn.out.append(data)
        conn.out_len += len(data)
        self._dirty[conn.id] = None

    def _write_frame(self, conn: Client, frame_type: int, data: bytes) -> None:
        self._write(conn, frame(frame_type, data))
