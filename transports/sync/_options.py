"""Keyword arguments of the blocking Consumer/Producer: the core's Config plus transport knobs.

Every keyword that names a :class:`~nsq_sansio.config.Config` field goes to the config (through
:func:`transports._common.make_config`, validated there; ``connect_timeout`` is one of them and
bounds the TCP connect plus the IDENTIFY/TLS/AUTH handshake); the others are TLS options:

* ``tls``: a :class:`transports._common.TLSOptions`, or the flat spellings ``ssl_context``,
  ``tls_ca_file``, ``tls_ca_data``, ``tls_cert_file``, ``tls_key_file``, ``tls_key_password``,
  ``tls_server_name``, ``tls_verify`` (True by default).

Giving any TLS option turns ``tls_v1`` on; verification is on unless ``tls_verify=False``.
"""

from __future__ import annotations

import dataclasses
import ssl
from dataclasses import dataclass, field
from typing import Any

from nsq_sansio.config import Config
from nsq_sansio.errors import ConfigError
from transports._common import TLSOptions, make_config

__all__ = ["TransportOptions", "split_options"]

_CONFIG_FIELDS = frozenset(f.name for f in dataclasses.fields(Config))
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
    """What the transport itself needs (the protocol's knobs live in Config)."""

    tls: TLSOptions = field(default_factory=TLSOptions)
    _context: list[ssl.SSLContext] = field(default_factory=list, repr=False, compare=False)

    def ssl_context(self) -> ssl.SSLContext:
        """The client context (built once, shared by every connection)."""
        if not self._context:
            self._context.append(self.tls.context())
        return self._context[0]


def split_options(config: Config | None, kwargs: dict[str, Any]) -> tuple[Config, TransportOptions]:
    """Build (Config, TransportOptions) from a base config and keyword arguments."""
    config_changes: dict[str, Any] = {}
    tls_changes: dict[str, Any] = {}
    tls: TLSOptions | None = None
    for name, value in kwargs.items():
        if name in _CONFIG_FIELDS:
            config_changes[name] = value
        elif name in _TLS_FLAT:
            tls_changes[_TLS_FLAT[name]] = value
        elif name == "tls":
            if not isinstance(value, TLSOptions):
                raise ConfigError(f"tls must be a transports._common.TLSOptions, got {value!r}")
            tls = value
        else:
            raise ConfigError(
                f"unknown option {name!r}: not a Config field nor a transport option "
                f"(tls, {', '.join(sorted(_TLS_FLAT))})"
            )
    if tls is not None and tls_changes:
        raise ConfigError("give either tls=TLSOptions(...) or the flat tls_* options, not both")
    if tls is None:
        tls = TLSOptions(**tls_changes)
    wants_tls = bool(tls_changes) or tls != TLSOptions()
    if wants_tls and "tls_v1" not in config_changes and not (config and config.tls_v1):
        config_changes["tls_v1"] = True
    return make_config(config, **config_changes), TransportOptions(tls)
