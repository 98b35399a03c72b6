"""A client's keyword arguments, sorted: protocol settings onto
:class:`~nsq_sansio.config.Config`, the rest onto :class:`TransportOptions`.

:func:`split_options` is what every consumer and producer calls with its ``**kwargs``:
``Config`` field names go to the config (:func:`make_config`), ``connect_timeout`` and the TLS
options (``tls=TLSOptions(...)`` or the flat ``tls_*`` names) to the transport,
``auth_secret_env``/``auth_secret_file`` are read into the config's ``auth_secret``
(:func:`read_auth_secret`), and anything else is a :class:`~nsq_sansio.errors.ConfigError`
that lists what is valid. IDENTIFY's ``client_id`` and ``hostname`` left at None get this
host's names (:func:`host_names`: the core cannot look them up, it does no IO). The
transports' own constants live here too (:data:`READ_SIZE`, the producer's
``connections_per_nsqd`` bounds).
"""

from __future__ import annotations

import dataclasses
import functools
import os
import socket
import ssl
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from nsq_sansio.config import Config
from nsq_sansio.errors import ConfigError

from .tls import TLSOptions

__all__ = [
    "MAX_CONNECTIONS_PER_NSQD",
    "READ_SIZE",
    "TransportOptions",
    "check_connections_per_nsqd",
    "host_names",
    "make_config",
    "read_auth_secret",
    "split_options",
]

#: How much a transport asks the socket for per read.
READ_SIZE = 64 * 1024


#: The most TCP connections a producer opens to one nsqd (``connections_per_nsqd``).
MAX_CONNECTIONS_PER_NSQD = 64


def check_connections_per_nsqd(value: object) -> None:
    """A producer's ``connections_per_nsqd``: an int from 1 to 64 (ConfigError otherwise)."""
    if (
        isinstance(value, bool)
        or not isinstance(value, int)
        or not 1 <= value <= MAX_CONNECTIONS_PER_NSQD
    ):
        raise ConfigError(
            f"connections_per_nsqd={value!r} must be an int from 1 to {MAX_CONNECTIONS_PER_NSQD}"
        )


_CONFIG_FIELDS = frozenset(f.name for f in dataclasses.fields(Config))


def make_config(config: Config | None = None, **overrides: Any) -> Config:
    """``config`` (or the defaults) with keyword arguments applied; unknown names are errors.

    ``auth_secret`` may be given as ``str``; durations are seconds, like :class:`Config`.
    """
    unknown = sorted(set(overrides) - _CONFIG_FIELDS)
    if unknown:
        raise ConfigError(
            f"unknown option(s) {', '.join(unknown)}; valid options are the Config fields: "
            + ", ".join(sorted(_CONFIG_FIELDS))
        )
    secret = overrides.get("auth_secret")
    if isinstance(secret, str):
        overrides["auth_secret"] = secret.encode()
    base = config if config is not None else Config()
    return base.replace(**overrides) if overrides else base


@functools.cache
def host_names() -> tuple[str, str]:
    """``(client_id, hostname)`` a client sends in IDENTIFY unless told otherwise: the short
    host name (up to the first dot) and the full one, as go-nsq does. ``gethostname()`` is the
    kernel's name (no DNS lookup, so it cannot hang); read once per process."""
    try:
        full = socket.gethostname()
    except OSError:
        full = ""
    return full.split(".", 1)[0], full


def with_host_names(config: Config) -> Config:
    """``config`` with ``client_id`` / ``hostname`` left at None set to :func:`host_names`."""
    if config.client_id is not None and config.hostname is not None:
        return config
    short, full = host_names()
    return config.replace(
        client_id=short if config.client_id is None else config.client_id,
        hostname=full if config.hostname is None else config.hostname,
    )


#: The most bytes an ``auth_secret_file`` may hold: a secret is short, a larger file is the
#: wrong one (and is not read whole).
MAX_AUTH_SECRET_FILE = 64 * 1024


def read_auth_secret(
    *, env: str | None = None, file: str | os.PathLike[str] | None = None
) -> bytes:
    """The AUTH secret from the environment variable ``env`` or from the file ``file``.

    Read once, when the client is made: a missing variable, an unreadable, empty or
    oversized file is a :class:`~nsq_sansio.errors.ConfigError` then (naming the variable or
    the path, never the content), not a failing connection later. One trailing newline of
    the file is dropped (``echo secret > file`` writes one).
    """
    if (env is None) == (file is None):
        raise ConfigError("give exactly one of auth_secret_env and auth_secret_file")
    if env is not None:
        if not isinstance(env, str) or not env:
            raise ConfigError(f"auth_secret_env must name an environment variable, got {env!r}")
        text = os.environ.get(env)
        if text is None:
            raise ConfigError(f"auth_secret_env={env!r}: that environment variable is not set")
        if not text:
            raise ConfigError(f"auth_secret_env={env!r}: that environment variable is empty")
        return os.fsencode(text)  # the bytes the environment holds
    path = os.fspath(file)  # type: ignore[arg-type]
    try:
        with open(path, "rb") as handle:
            value = handle.read(MAX_AUTH_SECRET_FILE + 1)
    except OSError as exc:
        raise ConfigError(
            f"auth_secret_file={path!r}: cannot read it ({exc.strerror or type(exc).__name__})"
        ) from None
    if len(value) > MAX_AUTH_SECRET_FILE:
        raise ConfigError(
            f"auth_secret_file={path!r} holds more than {MAX_AUTH_SECRET_FILE} bytes: not a secret"
        )
    if value.endswith(b"\r\n"):
        value = value[:-2]
    elif value.endswith(b"\n"):
        value = value[:-1]
    if not value:
        raise ConfigError(f"auth_secret_file={path!r} is empty")
    return value


#: Where else the AUTH secret may come from (:func:`read_auth_secret`).
_AUTH_SOURCES = {"auth_secret_env": "env", "auth_secret_file": "file"}


_TLS_FLAT = {
    "ssl_context": "ssl_context",
    "tls_ca_file": "ca_file",
    "tls_ca_data": "ca_data",
    "tls_cert_file": "cert_file",
    "tls_key_file": "key_file",
    "tls_key_password": "key_password",
    "tls_server_name": "server_name",
    "tls_verify": "verify",
}


@dataclass(frozen=True)
class TransportOptions:
    """What a transport itself needs (the protocol's knobs live in :class:`Config`);
    ``connect_timeout`` is the config's, copied here by :func:`split_options`."""

    connect_timeout: float = 10.0
    tls: TLSOptions = field(default_factory=TLSOptions)
    _context: list[ssl.SSLContext] = field(default_factory=list, repr=False, compare=False)

    def ssl_context(self) -> ssl.SSLContext:
        """The client context (built once, shared by every connection)."""
        if not self._context:
            self._context.append(self.tls.context())
        return self._context[0]


def split_options(
    config: Config | None, kwargs: Mapping[str, Any]
) -> tuple[Config, TransportOptions]:
    """Keyword arguments -> (Config, TransportOptions).

    Config field names go to the config (``client_id`` and ``hostname`` default to this
    host's names, :func:`with_host_names`); ``connect_timeout``, ``tls=TLSOptions(...)`` or the
    flat ``ssl_context``/``tls_ca_file``/``tls_ca_data``/``tls_cert_file``/``tls_key_file``/
    ``tls_key_password``/``tls_server_name``/``tls_verify`` are transport options. Giving any
    TLS option turns ``tls_v1`` on (verification stays on unless ``tls_verify=False``).
    ``auth_secret_env="VAR"`` or ``auth_secret_file=path`` read the AUTH secret now (instead
    of ``auth_secret``; at most one of the three).
    """
    config_changes: dict[str, Any] = {}
    tls_changes: dict[str, Any] = {}
    tls: TLSOptions | None = None
    secret_source: dict[str, Any] = {}
    for name, value in kwargs.items():
        if name in _CONFIG_FIELDS:
            config_changes[name] = value
        elif name in _AUTH_SOURCES:
            secret_source[_AUTH_SOURCES[name]] = value
        elif name in _TLS_FLAT:
            tls_changes[_TLS_FLAT[name]] = value
        elif name == "tls":
            if value is True:
                tls = TLSOptions()
            elif isinstance(value, TLSOptions):
                tls = value
            elif isinstance(value, ssl.SSLContext):
                tls = TLSOptions(ssl_context=value)
            else:
                raise ConfigError(f"tls must be True, a TLSOptions or an SSLContext, got {value!r}")
        else:
            raise ConfigError(
                f"unknown option {name!r}: not a Config field nor a transport option "
                f"(connect_timeout, tls, {', '.join(sorted([*_TLS_FLAT, *_AUTH_SOURCES]))})"
            )
    if secret_source:
        given = [n for n in ("auth_secret", *_AUTH_SOURCES) if n in kwargs]
        if len(given) > 1 or (config is not None and config.auth_secret is not None):
            raise ConfigError(
                f"the AUTH secret is given more than once ({', '.join(given)}"
                f"{', config.auth_secret' if config is not None and config.auth_secret else ''})"
                ": give one"
            )
        config_changes["auth_secret"] = read_auth_secret(**secret_source)
    if tls is not None and tls_changes:
        raise ConfigError("give either tls=TLSOptions(...) or the flat tls_* options, not both")
    if tls_changes:
        tls = TLSOptions(**tls_changes)
    if tls is not None:
        config_changes.setdefault("tls_v1", True)
    made = with_host_names(make_config(config, **config_changes))
    # One dial timeout for every runtime: the config's (the TCP connect and the handshake).
    return made, TransportOptions(made.connect_timeout, tls if tls is not None else TLSOptions())
