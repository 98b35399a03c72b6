"""TLS for the client side: :class:`TLSOptions` and :func:`build_ssl_context`.

What a consumer or producer checks of nsqd's certificate and which one it presents: an
:class:`ssl.SSLContext` with verification on by default, TLS 1.2 at least, a private CA, a
client certificate and the name to check. It reads certificate files when asked to and opens
no socket. ``repr()`` and ``str()`` show ``key_password`` and ``ca_data`` as ``'***'``.
"""

from __future__ import annotations

import dataclasses
import ssl
from dataclasses import dataclass

from nsq_sansio.errors import ConfigError

__all__ = ["TLSOptions", "build_ssl_context"]

#: Fields never shown by ``repr()``: a key's password, and the CA given inline (which may be a
#: private CA's, and is long).
_HIDDEN_FIELDS = frozenset({"key_password", "ca_data"})


@dataclass(frozen=True, slots=True)
class TLSOptions:
    """How to check nsqd's certificate and which one to present.

    ``verify`` is on by default: the server's chain is checked against the system store (or
    ``ca_file`` / ``ca_data``) and its name against ``server_name`` (default: the host
    connected to). ``ssl_context`` replaces everything else when given. ``repr()`` shows
    ``key_password`` and ``ca_data`` as ``'***'``.
    """

    verify: bool = True
    ca_file: str | None = None
    ca_data: str | bytes | None = None
    cert_file: str | None = None
    key_file: str | None = None
    key_password: str | None = None
    server_name: str | None = None
    ssl_context: ssl.SSLContext | None = None

    def __repr__(self) -> str:
        shown = (
            f"{f.name}='***'"
            if f.name in _HIDDEN_FIELDS and getattr(self, f.name) is not None
            else f"{f.name}={getattr(self, f.name)!r}"
            for f in dataclasses.fields(self)
        )
        return f"{type(self).__name__}({', '.join(shown)})"

    __str__ = __repr__

    def context(self) -> ssl.SSLContext:
        """An ``ssl.SSLContext`` built from these options (verification on unless ``verify`` is
        False)."""
        if self.ssl_context is not None:
            return self.ssl_context
        return build_ssl_context(
            verify=self.verify,
            ca_file=self.ca_file,
            ca_data=self.ca_data,
            cert_file=self.cert_file,
            key_file=self.key_file,
            key_password=self.key_password,
        )

    def server_hostname(self, host: str) -> str | None:
        """The name sent in SNI and checked against the certificate."""
        if self.server_name is not None:
            return self.server_name
        return host


def build_ssl_context(
    *,
    verify: bool = True,
    ca_file: str | None = None,
    ca_data: str | bytes | None = None,
    cert_file: str | None = None,
    key_file: str | None = None,
    key_password: str | None = None,
) -> ssl.SSLContext:
    """A client-side context: TLS >= 1.2, chain and host name checked unless ``verify=False``.

    ``ca_file``/``ca_data`` replace the system trust store (a private CA); ``cert_file`` (and
    ``key_file`` when the key is separate) present a client certificate.
    """
    if ca_file is not None or ca_data is not None:
        context = ssl.create_default_context(
            ssl.Purpose.SERVER_AUTH,
            cafile=ca_file,
            cadata=ca_data.decode() if isinstance(ca_data, bytes) else ca_data,
        )
    else:
        context = ssl.create_default_context(ssl.Purpose.SERVER_AUTH)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    if not verify:
        context.check_hostname = False
        context.verify_mode = ssl.CERT_NONE
    if cert_file is not None:
        context.load_cert_chain(cert_file, key_file, key_password)
    elif key_file is not None:
        raise ConfigError("key_file given without cert_file")
    return context
