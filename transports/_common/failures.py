"""Why a connection or a publish failed, in one wording for every runtime.

The producers build each nsqd's cause of a :class:`~nsq_sansio.errors.NoNSQDAvailable` here
(``127.0.0.1:4150: connection refused``, ``... connect timed out after 1 s``, ``... TLS
handshake failed: ...``, ``... connected, but no answer to IDENTIFY within 1 s``), each a
:class:`~nsq_sansio.errors.ConnectionLost` chained to the socket's own error, and the
``TimeoutError`` of a publish that got no answer.
"""

from __future__ import annotations

import socket
import ssl

from nsq_sansio.errors import ConnectionLost, LocalProtocolError, NSQError

__all__ = [
    "at_address",
    "check_enter_once",
    "closed_unanswered",
    "connect_failed",
    "connect_timed_out",
    "describe",
    "handshake_timed_out",
    "no_answer",
    "no_slot",
    "seconds",
    "tls_failed",
    "without_address",
]


def seconds(value: float) -> str:
    """``1 s``, ``0.25 s``: a duration as the messages print it."""
    return f"{value:g} s"


def describe(error: BaseException) -> str:
    """What went wrong with a socket, in a few words (no errno, no address)."""
    if isinstance(error, ConnectionRefusedError):
        return "connection refused"
    if isinstance(error, ConnectionResetError):
        return "connection reset by peer"
    if isinstance(error, socket.gaierror):
        return f"cannot resolve the host name ({error.strerror or error})"
    if isinstance(error, ssl.SSLError | ssl.CertificateError):
        return f"TLS handshake failed: {getattr(error, 'reason', None) or error}"
    if isinstance(error, OSError) and error.strerror:
        return error.strerror[0].lower() + error.strerror[1:]
    return str(error) or type(error).__name__


def connect_failed(address: str, error: BaseException) -> ConnectionLost:
    """The TCP connect to ``address`` failed with ``error`` (chained)."""
    lost = ConnectionLost(f"{address}: {describe(error)}")
    lost.__cause__ = error
    return lost


def connect_timed_out(address: str, timeout: float) -> ConnectionLost:
    return ConnectionLost(f"{address}: connect timed out after {seconds(timeout)}")


def tls_failed(address: str, error: BaseException) -> ConnectionLost:
    """The TLS handshake with ``address`` failed with ``error`` (chained)."""
    text = describe(error)
    if not text.startswith("TLS handshake failed"):
        text = f"TLS handshake failed: {text}"
    lost = ConnectionLost(f"{address}: {text}")
    lost.__cause__ = error
    return lost


def handshake_timed_out(address: str, timeout: float) -> ConnectionLost:
    """TCP connected, but the handshake (IDENTIFY, TLS, AUTH) did not end in time: a hung
    nsqd, or something that is not an nsqd."""
    return ConnectionLost(
        f"{address}: connected, but the handshake (IDENTIFY) got no answer within "
        f"{seconds(timeout)}"
    )


def no_answer(kind: str, topic: str, address: str, timeout: float) -> TimeoutError:
    """A publish written to ``address`` was not answered within its timeout (it may have
    been stored)."""
    return TimeoutError(f"{kind} to {topic!r}: no answer from {address} within {seconds(timeout)}")


def closed_unanswered(kind: str, topic: str, *, sent: bool) -> ConnectionLost:
    """The producer closed (its ``close()`` timeout passed) before this publish was answered:
    it fails, never sent again; one ``sent`` (written to nsqd) may have been stored."""
    if sent:
        return ConnectionLost(
            f"{kind} to {topic!r}: the producer closed before nsqd answered "
            "(it may have been stored)"
        )
    return ConnectionLost(f"{kind} to {topic!r}: the producer closed before it was sent")


def no_slot(max_pending: int, timeout: float) -> TimeoutError:
    """``max_pending`` publishes stayed unanswered for the whole timeout of a new one."""
    return TimeoutError(
        f"{max_pending} publishes unanswered for {seconds(timeout)} (max_pending reached)"
    )


def at_address(address: str, error: BaseException) -> BaseException:
    """``error`` as a cause :class:`~nsq_sansio.errors.NoNSQDAvailable` keeps: its text starts
    with ``address`` (a ``ConnectionLost`` chained to ``error`` unless it does already)."""
    text = str(error) if isinstance(error, NSQError) else describe(error)
    if text.startswith(f"{address}: "):
        return error
    lost = ConnectionLost(f"{address}: {text}")
    lost.__cause__ = error
    return lost


def without_address(address: str, error: BaseException) -> str:
    """``error``'s text for a log line that starts with ``address``: without the address in
    front (``127.0.0.1:4150: ...``, ``127.0.0.1:4150 answered like ...``), and named "nsqd"
    where the text names it further on, so the line says it once."""
    text = str(error)
    for prefix in (f"{address}: ", f"{address} "):
        if text.startswith(prefix):
            text = text[len(prefix) :]
            break
    return text.replace(address, "nsqd")


def check_enter_once(closed: bool, entered: bool, block: str) -> None:
    """A producer's block is entered once, the same on every runtime: LocalProtocolError when
    it is closed or already entered (``block``: ``with`` or ``async with``, for the message).
    A second block's end would close the producer under the first one."""
    if closed:
        raise LocalProtocolError("the producer is closed")
    if entered:
        raise LocalProtocolError(f"the producer is already entered (`{block}` it once)")
