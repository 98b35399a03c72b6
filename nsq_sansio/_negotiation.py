"""A client connection's handshake: IDENTIFY, the upgrades it negotiates (TLS, then snappy or
deflate), and AUTH, up to READY.

Rules:

* A feature asked for is required: ``tls_v1``, ``snappy`` or ``deflate`` that nsqd does not
  enable fails the connection with an :class:`~nsq_sansio.errors.IncompatibleNSQD` (the same
  nsqd answers the same way to every reconnect); one enabled without being asked for is a
  protocol error.
* Upgrades happen at exactly the byte nsqd switches: the bytes after the IDENTIFY answer
  belong to the TLS layer, those after TLS's OK (or IDENTIFY's, without TLS) are compressed,
  and whatever was queued before the switch goes out uncompressed.
* AUTH is sent only when nsqd requires it, never without a secret, and never in clear when
  ``auth_requires_tls`` says so.
* Answers to the handshake are small JSON objects: one above :data:`MAX_ANSWER_SIZE` is
  refused before it is buffered or parsed, and a peer that is not nsqd's TCP port (nsqd's HTTP
  port, nsqlookupd) is named as such.
"""

from __future__ import annotations

import json
from collections import deque
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from . import frames
from ._connection_lifecycle import Awaiting, ConnectionState, Lifecycle
from ._publishing import MAX_DELAY_MS
from .compression import Codec, DeflateCodec, SnappyCodec
from .errors import (
    AuthSecretMissing,
    CompressionUnavailable,
    FrameTooLarge,
    InsecureAuthRefused,
    LocalProtocolError,
    NSQError,
    RemoteProtocolError,
    TLSUnavailable,
    WrongPort,
)
from .events import AuthResult, ConnectionReady, Event, ServerSettings

__all__ = ["MAX_ANSWER_SIZE", "Negotiation", "identify_fields"]

_S = ConnectionState
#: The largest IDENTIFY or AUTH answer read (bytes): nsqd's are a few hundred bytes of JSON, so
#: anything near this is not nsqd, and is refused before it is buffered or parsed.
MAX_ANSWER_SIZE = 64 * 1024
#: Heartbeats nsqd sends when IDENTIFY does not set an interval (ms).
_DEFAULT_HEARTBEAT_MS = 30_000
_HTTP_HINT = "is it nsqd's HTTP port? nsqd's TCP port is usually 4150"
#: What nsqlookupd's TCP port answers to protocol V2's magic: a size, then this error, unframed.
_LOOKUPD_REFUSAL = b"E_BAD_PROTOCOL"


def identify_fields(identify: Mapping[str, object] | None) -> tuple[dict[str, Any], float | None]:
    """IDENTIFY's JSON fields (``feature_negotiation`` on), checked, and the seconds between
    nsqd's heartbeats they ask for (None when they turn them off)."""
    fields: dict[str, Any] = dict(identify or {})
    fields["feature_negotiation"] = True
    if fields.get("snappy") and fields.get("deflate"):
        raise LocalProtocolError("snappy and deflate are mutually exclusive; ask for one")
    interval = fields.get("heartbeat_interval", 0)
    if (
        isinstance(interval, bool)
        or not isinstance(interval, int)
        or not (interval in (-1, 0) or interval >= 1000)
    ):
        raise LocalProtocolError(
            f"heartbeat_interval must be an int of ms: -1 (off), 0 (nsqd's default) or "
            f">= 1000, got {interval!r}"
        )
    if interval == 0:
        interval = _DEFAULT_HEARTBEAT_MS
    return fields, None if interval < 0 else interval / 1000


class Negotiation:
    """The handshake of :class:`~nsq_sansio.connection.ClientConnection` (a part of it: the
    connection's ``__slots__`` hold these fields), driven by the answers the frame loop reads."""

    if not TYPE_CHECKING:  # the fields are in the connection's __slots__ (one layout for all)
        __slots__ = ()

    #: IDENTIFY's fields as sent: what was asked for.
    _requested: dict[str, Any]
    _auth_secret: bytes | None
    _auth_requires_tls: bool
    #: The server's name in error messages, or None.
    _peer: str | None
    #: Set once the switch to TLS or compression is decided: the frame loop stops there.
    _switch: bool
    _codec: Codec | None
    # The connection's, shared with its other parts.
    _state: ConnectionState
    _out: list[bytes]
    _out_plain: bytes
    _awaiting: deque[tuple[Awaiting, int]]
    _frame_limit: int
    _max_frame_size: int
    _expiry_window: float
    _max_req_timeout: float | None
    settings: ServerSettings | None
    auth: AuthResult | None

    if TYPE_CHECKING:

        def _enter(self, event: Lifecycle) -> None: ...

    def _on_identify(self, payload: bytes, events: list[Event]) -> None:
        requested = self._requested
        if payload == frames.OK:
            # An nsqd from before feature negotiation: none of the features can be had.
            self.settings = settings = ServerSettings.default()
            self._check_features(settings, negotiated=False)
            self._after_upgrades(events)
            return
        _check_answer_size("IDENTIFY", payload)
        data = json.loads(payload)
        if not isinstance(data, dict):
            raise RemoteProtocolError(f"IDENTIFY answer is not a JSON object: {payload[:64]!r}")
        settings = ServerSettings.from_json(data)
        for feature in ("tls_v1", "snappy", "deflate"):
            if getattr(settings, feature) and not requested.get(feature):
                raise RemoteProtocolError(f"nsqd enabled {feature}, which was not requested")
        self._check_features(settings, negotiated=True)
        self.settings = settings
        self._expiry_window = settings.msg_timeout / 2000
        max_req = data.get("max_req_timeout")  # not nsqd's (it does not say), a broker's may
        if (
            self._max_req_timeout is None
            and isinstance(max_req, int)
            and not isinstance(max_req, bool)
            and 0 <= max_req <= MAX_DELAY_MS
        ):
            self._max_req_timeout = max_req / 1000
        if settings.tls_v1:
            self._awaiting.append((Awaiting.TLS_OK, 0))
            self._enter(Lifecycle.TLS_NEGOTIATED)
            self._switch = True
            return
        if not self._start_compression():
            self._after_upgrades(events)

    def _on_upgraded(self, kind: Awaiting, payload: bytes, events: list[Event]) -> None:
        """nsqd's answer to the switch to TLS or to compression, read over the new layer."""
        if payload != frames.OK:
            raise RemoteProtocolError(
                f"expected OK after the {kind.name} upgrade, got {payload[:64]!r}"
            )
        if kind is Awaiting.TLS_OK and self._start_compression():
            return
        self._after_upgrades(events)

    def _check_features(self, settings: ServerSettings, *, negotiated: bool) -> None:
        """Every feature asked for must be granted: one that is not fails the connection for
        good (the same nsqd answers the same way to every reconnect)."""
        requested = self._requested
        who = self._peer or "nsqd"
        why = "" if negotiated else " (it is too old to negotiate features)"
        if requested.get("tls_v1") and not settings.tls_v1:
            fix = "give nsqd a certificate (--tls-cert, --tls-key)" if negotiated else "upgrade it"
            raise TLSUnavailable(
                f"TLS was requested (tls_v1) but {who} did not enable it{why}: {fix}, "
                "or turn tls_v1 off"
            )
        for feature in ("snappy", "deflate"):
            if requested.get(feature) and not getattr(settings, feature):
                fix = f"nsqd runs with --{feature}=false?" if negotiated else "upgrade it"
                raise CompressionUnavailable(
                    f"{feature} compression was requested but {who} did not enable it{why} "
                    f"({fix}): turn {feature} off in this client's configuration, or on in nsqd",
                    feature,
                )

    def _start_compression(self) -> bool:
        """Switch compression on for both directions, if negotiated; True when it was."""
        settings = self.settings
        assert settings is not None
        if settings.snappy:
            self._codec = SnappyCodec()
        elif settings.deflate:
            # Our own output's level is ours to pick; follow nsqd's where it is a valid one.
            level = settings.deflate_level if 1 <= settings.deflate_level <= 9 else 6
            self._codec = DeflateCodec(level)
        else:
            return False
        # Whatever was queued before the switch goes out uncompressed.
        self._out_plain += b"".join(self._out)
        self._out.clear()
        self._awaiting.append((Awaiting.COMPRESSION_OK, 0))
        self._enter(Lifecycle.COMPRESSION_NEGOTIATED)
        self._switch = True
        return True

    def _after_upgrades(self, events: list[Event]) -> None:
        settings = self.settings
        assert settings is not None
        if settings.auth_required:
            who = self._peer or "nsqd"
            if self._auth_secret is None:
                raise AuthSecretMissing(
                    f"{who} requires AUTH (it has an auth server, --auth-http-address) and no "
                    "auth secret is configured: set auth_secret"
                )
            if self._auth_requires_tls and not settings.tls_v1:
                raise InsecureAuthRefused(
                    f"{who} requires AUTH and the connection is not TLS: auth_requires_tls "
                    "refuses to send the secret in clear; turn tls_v1 on (nsqd needs "
                    "--tls-cert and --tls-key)"
                )
            self._out.append(frames.encode_auth(self._auth_secret))
            self._awaiting.append((Awaiting.AUTH, 0))
            self._enter(Lifecycle.AUTH_SENT)
            return
        self._enter(Lifecycle.NEGOTIATED)
        self._frame_limit = self._max_frame_size
        events.append(ConnectionReady(settings, None))

    def _on_auth(self, payload: bytes, events: list[Event]) -> None:
        _check_answer_size("AUTH", payload)
        data = json.loads(payload)
        if not isinstance(data, dict):
            raise RemoteProtocolError(f"AUTH answer is not a JSON object: {payload[:64]!r}")
        count = data.get("permission_count", 0)
        if isinstance(count, bool) or not isinstance(count, int):
            raise RemoteProtocolError(f"AUTH answer permission_count must be an int, got {count!r}")
        self.auth = AuthResult(
            identity=str(data.get("identity", "")),
            identity_url=str(data.get("identity_url", "")),
            permission_count=count,
            raw=data,
        )
        self._enter(Lifecycle.AUTHENTICATED)
        self._frame_limit = self._max_frame_size
        assert self.settings is not None
        events.append(ConnectionReady(self.settings, self.auth))

    def _handshake_error(self, error: RemoteProtocolError, data: bytes, pos: int) -> NSQError:
        """What broke the handshake, said plainly when the peer is not nsqd's TCP port at all
        (nsqd's HTTP port, nsqlookupd) or sent an answer far larger than nsqd's."""
        if self._state is _S.IDENTIFYING:
            who = self._peer or "the server"
            head = data[pos : pos + 5]
            if len(head) >= 4 and b"HTTP/".startswith(head):  # "HTTP" read as a frame size
                line = data[pos:].split(b"\r\n", 1)[0][:64].decode("ascii", "replace")
                return WrongPort(
                    f"{who} answered like an HTTP server ({line!r}): {_HTTP_HINT}", "HTTP"
                )
            if data.startswith(_LOOKUPD_REFUSAL, 4):  # nsqlookupd's answer to any magic but V1
                return WrongPort(
                    f"{who} answered like nsqlookupd (E_BAD_PROTOCOL to protocol V2): is it "
                    "nsqlookupd's TCP port, usually 4160? nsqd's TCP port is usually 4150",
                    "nsqlookupd",
                )
        if isinstance(error, FrameTooLarge):  # still one, with the handshake's own limit said
            error.args = (
                f"nsqd announced a {error.size}-byte frame in state {self._state.name}; "
                f"answers to IDENTIFY and AUTH are read up to {MAX_ANSWER_SIZE} bytes",
            )
        return error


def _check_answer_size(what: str, payload: bytes) -> None:
    """nsqd's IDENTIFY and AUTH answers are small JSON objects: a huge one is not parsed."""
    if len(payload) > MAX_ANSWER_SIZE:
        raise RemoteProtocolError(
            f"{what} answer of {len(payload)} bytes is above the {MAX_ANSWER_SIZE} bytes "
            "read for it (nsqd's is a few hundred)"
        )
