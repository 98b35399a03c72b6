"""Keyword arguments of the blocking Consumer/Producer: the core's Config plus transport knobs.

Every keyword that names a :class:`~nsq_sansio.config.Config` field goes to the config (and is
validated there); the rest are transport options (TLS files, timeouts). ``tls_v1=True`` or any
TLS option turns TLS on; verification is on by default.
"""

from __future__ import annotations

import dataclasses
import ssl
from dataclasses import dataclass
from typing import Any

from nsq_sansio.config import Config
from nsq_sansio.errors import ConfigError

__all__ = ["TransportOptions", "build_ssl_context", "split_options"]

_CONFIG_FIELDS = frozenset(f.name for f in dataclasses.fields(Config))


@dataclass(frozen=True)
class TransportOptions:
    """What the transport itself needs (the protocol's knobs live in Config)."""

    #: Seconds allowed for a TCP connect (and the TLS handshake that may follow).
    connect_timeout: float = 5.0
    #: A ready-made context; when set, the other ``tls_*`` options are ignored.
    ssl_context: ssl.SSLContext | None = None
    #: CA bundle (PEM file) to verify nsqd with, instead of the system's.
    tls_ca_file: str | None = None
    #: Client certificate and key (PEM) for nsqd's --tls-client-auth-policy.
    tls_cert_file: str | None = None
    tls_key_file: str | None = None
    #: Name checked against nsqd's certificate (default: the host connected to).
    tls_server_name: str | None = None
    #: Check nsqd's certificate and name. Turn off only for local experiments.
    tls_verify: bool = True

    @property
    def tls_requested(self) -> bool:
        return (
            self.ssl_context is not None
            or self.tls_ca_file is not None
            or self.tls_cert_file is not None
        )


def build_ssl_context(options: TransportOptions) -> ssl.SSLContext:
    """A client context: TLS 1.2+, verification on unless ``tls_verify=False``."""
    if options.ssl_context is not None:
        return options.ssl_context
    context = ssl.create_default_context(ssl.Purpose.SERVER_AUTH, cafile=options.tls_ca_file)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    if not options.tls_verify:
        context.check_hostname = False
        context.verify_mode = ssl.CERT_NONE
    if options.tls_cert_file is not None:
        context.load_cert_chain(options.tls_cert_file, options.tls_key_file)
    return context


def split_options(
    config: Config | None, kwargs: dict[str, Any], *, defaults: dict[str, Any] | None = None
) -> tuple[Config, TransportOptions]:
    """Build (Config, TransportOptions) from a base config and keyword arguments."""
    transport_fields = {f.name for f in dataclasses.fields(TransportOptions)}
    config_changes: dict[str, Any] = dict(defaults or {}) if config is None else {}
    transport_changes: dict[str, Any] = {}
    for name, value in kwargs.items():
        if name in _CONFIG_FIELDS:
            config_changes[name] = value
        elif name in transport_fields:
            transport_changes[name] = value
        else:
            raise ConfigError(
                f"unknown option {name!r}: not a Config field nor a transport option "
                f"({', '.join(sorted(transport_fields))})"
            )
    if isinstance(config_changes.get("auth_secret"), str):
        config_changes["auth_secret"] = config_changes["auth_secret"].encode()
    options = TransportOptions(**transport_changes)
    if options.connect_timeout <= 0:
        raise ConfigError(f"connect_timeout={options.connect_timeout!r} must be > 0 seconds")
    if options.tls_requested and "tls_v1" not in config_changes:
        config_changes["tls_v1"] = True
    base = config if config is not None else Config()
    return base.replace(**config_changes) if config_changes else base, options
