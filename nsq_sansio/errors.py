"""The exception hierarchy: every error the library raises or reports is an :class:`NSQError`.

The families, as in h11: a :class:`ProtocolError` is either the peer breaking the protocol
(:class:`RemoteProtocolError`) or this side using the API wrongly (:class:`LocalProtocolError`);
nsqd answered with an ``E_*`` error frame (:class:`ServerError`, which keeps NSQ's code and
text and knows whether NSQ treats it as fatal); a value is out of range (:class:`ConfigError`,
and :class:`IncompatibleNSQD` when an nsqd cannot serve it); a connection ended
(:class:`ConnectionLost`) or none could be made (:class:`NoNSQDAvailable`). Every client
runtime (anyio, trio, blocking) raises these same classes for the same cases.
"""

from __future__ import annotations

from collections.abc import Sequence

__all__ = [
    "AuthFailed",
    "AuthSecretMissing",
    "BadBody",
    "BadChannel",
    "BadMessage",
    "BadTopic",
    "CoalescedPublishRefused",
    "CompressionError",
    "CompressionUnavailable",
    "ConfigError",
    "ConnectionLost",
    "DPubFailed",
    "DelayOutOfRange",
    "FinFailed",
    "FrameTooLarge",
    "HTTPPublishError",
    "IdentifyRejected",
    "IncompatibleNSQD",
    "InsecureAuthRefused",
    "InvalidCommand",
    "InvalidName",
    "LocalProtocolError",
    "LookupdError",
    "MPubFailed",
    "MessageGone",
    "NSQError",
    "NoNSQDAvailable",
    "ProtocolError",
    "PubFailed",
    "ReadyCountExceeded",
    "RemoteProtocolError",
    "ReqFailed",
    "ServerError",
    "TLSUnavailable",
    "TouchFailed",
    "Unauthorized",
    "WrongPort",
]


class NSQError(Exception):
    """Base class of every error raised or reported by nsq-sansio."""


class ProtocolError(NSQError):
    """The protocol was broken: by the peer (:class:`RemoteProtocolError`) or by this side's use
    of the API (:class:`LocalProtocolError`). Catch this to catch both."""


class RemoteProtocolError(ProtocolError):
    """The peer sent bytes that break protocol V2 (malformed or oversized frame, bad JSON...)."""


class FrameTooLarge(RemoteProtocolError):
    """A frame announced a size above the configured maximum; nothing was buffered for it."""

    def __init__(self, size: int, limit: int) -> None:
        super().__init__(f"frame of {size} bytes announced, above the maximum frame size {limit}")
        self.size = size
        self.limit = limit


class CompressionError(RemoteProtocolError):
    """A compressed stream was corrupt, or expanded past the allowed bound."""


class ConnectionLost(NSQError):
    """The connection ended (EOF or transport failure) before it was closed cleanly, or could
    not be made; the message says which and why (``127.0.0.1:4150: connection refused``)."""


class NoNSQDAvailable(NSQError):
    """No nsqd of a producer's pool could take a request: each refused the connection, could
    not be reached or answer its handshake in time, or closed the connection before answering.

    ``errors`` holds each nsqd's cause (a :class:`ConnectionLost` whose text starts with the
    address, chained to the socket's own error); the message lists them all, and the first is
    the ``__cause__``. A publish that reached nsqd and got no answer in time raises
    ``TimeoutError`` instead (it may have been stored)."""

    def __init__(self, errors: Sequence[BaseException], *, what: str = "the publish") -> None:
        detail = "; ".join(str(error) for error in errors) or "no nsqd answered"
        super().__init__(f"no nsqd could take {what}: {detail}")
        self.errors = tuple(errors)
        if self.errors:
            self.__cause__ = self.errors[0]


class LocalProtocolError(ProtocolError):
    """This side asked for something the protocol or the current state does not allow: a bad
    argument (a negative delay, a batch of 0), a call in the wrong state (``fetch()`` on a push
    consumer, publishing on a closed producer). Raised where the call was made."""


class InvalidName(LocalProtocolError, ValueError):
    """A topic or channel name does not match NSQ's rules."""


class ConfigError(NSQError, ValueError):
    """A configuration value is out of range; the message names the field and the allowed range."""


class MessageGone(NSQError):
    """The message can no longer be answered here: its connection closed, drain requeued it,
    or nsqd delivered it again (it had timed out). nsqd requeues it by itself. Never raised:
    it is the ``error`` of a ``TakenBack`` report."""


class HTTPPublishError(NSQError):
    """nsqd's HTTP API refused a publish (``HTTPProducer``): ``status`` and nsqd's ``message``
    (``400 INVALID_TOPIC``...). Raised for that publish only, never retried."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(f"HTTP {status} {message}".rstrip())
        self.status = status
        self.message = message


class LookupdError(NSQError):
    """A lookupd answered garbage, an error status, or nothing; it is skipped this round.
    Never raised to the user: it is the ``error`` of a ``LookupdFailed`` report."""

    def __init__(self, message: str, status: int | None = None) -> None:
        super().__init__(message)
        self.status = status


class ServerError(NSQError):
    """nsqd answered with an error frame such as ``E_INVALID``; ``code`` and ``text`` are kept.

    ``fatal`` follows NSQ's client guide: only ``E_FIN_FAILED``, ``E_REQ_FAILED`` and
    ``E_TOUCH_FAILED`` leave the connection usable; any other error closes it.
    """

    code: str = "E_UNKNOWN"

    def __init__(self, code: str, text: str) -> None:
        super().__init__(f"{code} {text}".rstrip())
        self.code = code
        self.text = text

    @property
    def fatal(self) -> bool:
        """Whether nsqd closes the connection after this error (all but FIN/REQ/TOUCH failures)."""
        return self.code not in NON_FATAL_CODES

    @classmethod
    def from_frame(cls, data: bytes) -> ServerError:
        """Build the right subclass from an error frame's payload (``b"E_CODE text..."``)."""
        decoded = data.decode("utf-8", "replace")
        code, _, text = decoded.partition(" ")
        if not code:
            code = "E_UNKNOWN"
        error_class = _BY_CODE.get(code, ServerError)
        return error_class(code, text)


class IncompatibleNSQD(ConfigError):
    """The nsqd at this address cannot serve this configuration, so reconnecting cannot help.

    Consumers fail with it (iteration, ``run()`` and ``fetch()`` raise it) and publishes raise
    it instead of retrying. :class:`IdentifyRejected` is the case where nsqd refused IDENTIFY.
    """


class IdentifyRejected(IncompatibleNSQD):
    """nsqd refused IDENTIFY (``E_BAD_BODY IDENTIFY output buffer timeout (10) is invalid``...).

    The configuration asks for something this nsqd does not allow (a value outside its
    ``--max-*`` / ``--min-*`` limits), so reconnecting cannot help: consumers fail with it and
    publishes raise it instead of retrying. ``error`` is nsqd's answer, ``code``/``text`` its parts.
    """

    def __init__(self, error: ServerError) -> None:
        super().__init__(f"nsqd refused IDENTIFY, check the configuration: {error}")
        self.error = error
        self.code = error.code
        self.text = error.text


class WrongPort(IncompatibleNSQD):
    """The peer is not nsqd's TCP port: it answered like an HTTP server (nsqd's HTTP port,
    usually 4151) or like nsqlookupd. ``looks_like`` says which (``"HTTP"``, ``"nsqlookupd"``)."""

    def __init__(self, message: str, looks_like: str) -> None:
        super().__init__(message)
        self.looks_like = looks_like


class TLSUnavailable(IncompatibleNSQD):
    """TLS was asked for (``tls_v1``) and nsqd did not enable it: it has no certificate
    configured (``--tls-cert``/``--tls-key``), or predates feature negotiation."""


class CompressionUnavailable(IncompatibleNSQD):
    """Snappy or deflate was asked for and nsqd did not enable it (``--snappy=false``,
    ``--deflate=false``, or an nsqd without feature negotiation). ``feature`` names it."""

    def __init__(self, message: str, feature: str) -> None:
        super().__init__(message)
        self.feature = feature


class AuthSecretMissing(IncompatibleNSQD):
    """nsqd requires AUTH (it has ``--auth-http-address``) and no auth secret is configured."""


class InsecureAuthRefused(IncompatibleNSQD):
    """nsqd requires AUTH on a connection without TLS, and ``auth_requires_tls`` forbids
    sending the secret in clear."""


class ReadyCountExceeded(RemoteProtocolError):
    """nsqd sent more messages than the RDY it was given allows; the connection is closed and
    the messages beyond the bound were not delivered (nsqd requeues them). ``held`` is how many
    messages would have been held (unanswered, not timed out), ``rdy`` the RDY count the bound
    came from and ``allowed`` the bound."""

    def __init__(self, message: str, *, held: int, rdy: int, allowed: int) -> None:
        super().__init__(message)
        self.held = held
        self.rdy = rdy
        self.allowed = allowed


class DelayOutOfRange(LocalProtocolError, ValueError):
    """A REQ or DPUB delay is above nsqd's ``max_req_timeout``; nothing was sent.

    ``delay`` and ``limit`` are in seconds. nsqd answers an over-long DPUB with a fatal
    ``E_INVALID`` (it closes the connection) and silently shortens an over-long REQ.
    """

    def __init__(self, message: str, *, delay: float, limit: float) -> None:
        super().__init__(message)
        self.delay = delay
        self.limit = limit


class CoalescedPublishRefused(NSQError):
    """nsqd refused the MPUB that this PUB was coalesced into (``error`` is its answer).

    Only a program driving :class:`~nsq_sansio.connection.ClientConnection` itself sees it (in
    ``PublishFailed.error``). MPUB is all or nothing, so nothing of it was stored, and the
    fault may be another message's: the PUB is to be sent again on its own
    (``publish(..., coalesce=False)``), where it gets its own answer. The producers do that,
    so their callers never see this error.
    """

    def __init__(self, error: ServerError) -> None:
        super().__init__(f"the MPUB this publish was coalesced into was refused: {error}")
        self.error = error


class InvalidCommand(ServerError):
    """``E_INVALID``: the command, its arguments or the state it was sent in are invalid."""


class BadBody(ServerError):
    """``E_BAD_BODY``: a command body (IDENTIFY, MPUB, AUTH) could not be read."""


class BadTopic(ServerError):
    """``E_BAD_TOPIC``: the topic name was rejected."""


class BadChannel(ServerError):
    """``E_BAD_CHANNEL``: the channel name was rejected."""


class BadMessage(ServerError):
    """``E_BAD_MESSAGE``: a message body was empty or too large."""


class PubFailed(ServerError):
    """``E_PUB_FAILED``: nsqd could not accept the published message."""


class MPubFailed(ServerError):
    """``E_MPUB_FAILED``: nsqd could not accept the multi-publish."""


class DPubFailed(ServerError):
    """``E_DPUB_FAILED``: nsqd could not accept the deferred publish."""


class FinFailed(ServerError):
    """``E_FIN_FAILED``: the message was no longer in flight here (it timed out, usually)."""


class ReqFailed(ServerError):
    """``E_REQ_FAILED``: the message was no longer in flight here."""


class TouchFailed(ServerError):
    """``E_TOUCH_FAILED``: the message was no longer in flight here."""


class AuthFailed(ServerError):
    """``E_AUTH_FAILED``: nsqd could not check the secret with its auth server."""


class Unauthorized(ServerError):
    """``E_UNAUTHORIZED``: the secret grants no permission for this action."""


NON_FATAL_CODES = frozenset({"E_FIN_FAILED", "E_REQ_FAILED", "E_TOUCH_FAILED"})

_BY_CODE: dict[str, type[ServerError]] = {
    "E_INVALID": InvalidCommand,
    "E_BAD_BODY": BadBody,
    "E_BAD_TOPIC": BadTopic,
    "E_BAD_CHANNEL": BadChannel,
    "E_BAD_MESSAGE": BadMessage,
    "E_PUB_FAILED": PubFailed,
    "E_MPUB_FAILED": MPubFailed,
    "E_DPUB_FAILED": DPubFailed,
    "E_FIN_FAILED": FinFailed,
    "E_REQ_FAILED": ReqFailed,
    "E_TOUCH_FAILED": TouchFailed,
    "E_AUTH_FAILED": AuthFailed,
    "E_UNAUTHORIZED": Unauthorized,
}
