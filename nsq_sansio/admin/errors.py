"""The admin calls' errors: an error status (:class:`AdminHTTPError`, and the not-found
ones nsqd and nsqlookupd name), an answer that is not what the API documents
(:class:`AdminResponseError`), and :func:`http_error`, which picks the class for an answer."""

from __future__ import annotations

import json

from ..errors import NSQError, RemoteProtocolError

__all__ = [
    "AdminHTTPError",
    "AdminResponseError",
    "ChannelNotFound",
    "TopicNotFound",
    "http_error",
]


class AdminHTTPError(NSQError):
    """nsqd or nsqlookupd answered an HTTP API call with an error status.

    ``status`` is the HTTP status, ``message`` the server's own text (nsqd's code such as
    ``INVALID_TOPIC``, or the health text of a failing ``/ping``), ``method`` and ``target``
    the request and ``endpoint`` where it went.
    """

    def __init__(
        self, status: int, message: str, *, method: str = "", target: str = "", endpoint: str = ""
    ) -> None:
        where = " ".join(part for part in (endpoint, method, target) if part)
        super().__init__(f"{where + ': ' if where else ''}HTTP {status} {message}".rstrip())
        self.status = status
        self.message = message
        self.method = method
        self.target = target
        self.endpoint = endpoint


class TopicNotFound(AdminHTTPError):
    """The topic does not exist there (nsqd's and nsqlookupd's ``404 TOPIC_NOT_FOUND``)."""


class ChannelNotFound(AdminHTTPError):
    """The channel does not exist on that topic (``404 CHANNEL_NOT_FOUND``)."""


class AdminResponseError(RemoteProtocolError):
    """An answer was not what the HTTP API documents: not JSON, a field of the wrong type, a
    missing name; the message says which field (``topics[0].channels[2].depth``...)."""


_NOT_FOUND: dict[str, type[AdminHTTPError]] = {
    "TOPIC_NOT_FOUND": TopicNotFound,
    "CHANNEL_NOT_FOUND": ChannelNotFound,
}


def http_error(
    status: int, body: bytes, method: str = "", target: str = "", endpoint: str = ""
) -> AdminHTTPError:
    """The typed error for an error answer: nsqd's ``{"message": ...}`` (or the old
    ``status_txt`` envelope, or plain text) as ``message``; the not-found codes get their
    own class."""
    text = body[:4096].decode("utf-8", "replace").strip()
    message = text
    try:
        document = json.loads(text) if text else None
    except (ValueError, RecursionError):
        document = None
    if isinstance(document, dict):
        found = document.get("message", document.get("status_txt"))
        if isinstance(found, str):
            message = found
        inner = document.get("status_code")
        if isinstance(inner, int) and not isinstance(inner, bool) and 100 <= inner <= 999:
            status = inner
    kind = _NOT_FOUND.get(message, AdminHTTPError) if status == 404 else AdminHTTPError
    return kind(status, message, method=method, target=target, endpoint=endpoint)
