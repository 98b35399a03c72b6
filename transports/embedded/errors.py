"""What starting an embedded server raises: one plain exception naming what failed and why.

A server that cannot start (a port in use, a certificate that cannot be loaded) raises one of
these, never an exception group: the address or file it names is the one at fault, so a
caller (the CLI among them) can report it as it is. Both are ``OSError`` (their ``errno`` and
``strerror`` are the cause's) so ``except OSError`` keeps working; the cause is chained.
"""

from __future__ import annotations

__all__ = ["ListenError", "TLSFileError"]


def _reason(cause: BaseException) -> str:
    if isinstance(cause, OSError) and cause.strerror:
        return str(cause.strerror)
    return str(cause) or type(cause).__name__


class ListenError(OSError):
    """A server could not listen on one of its addresses: ``cannot listen on 127.0.0.1:4150
    (tcp_address): Address already in use``. ``option`` is the keyword argument that gave
    the address (``tcp_address``, ``http_address``, ``https_address``)."""

    def __init__(self, address: str, option: str, cause: BaseException) -> None:
        errno = cause.errno if isinstance(cause, OSError) else None
        super().__init__(errno, _reason(cause))
        self.address = address
        self.option = option

    def __str__(self) -> str:
        return f"cannot listen on {self.address} ({self.option}): {self.strerror}"


class TLSFileError(OSError):
    """The TLS certificate, key or CA file could not be loaded: ``cannot load tls_cert
    'cert.pem' / tls_key 'key.pem': No such file or directory``."""

    def __init__(self, files: str, cause: BaseException) -> None:
        errno = cause.errno if isinstance(cause, OSError) else None
        super().__init__(errno, _reason(cause))
        self.files = files

    def __str__(self) -> str:
        return f"cannot load {self.files}: {self.strerror}"
