"""IDENTIFY's JSON body, type-checked as nsqd decodes it (nsqd's ``identifyDataV2``).

:func:`parse_identify` turns the body into an :class:`Identify` or fails with ``E_BAD_BODY``
exactly where nsqd's JSON decoding would (a wrong type, an integer out of int64 range). The
range checks of each setting against the node's options, and the negotiation of TLS and
compression, are the IDENTIFY command's (:mod:`.protocol_v2`).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from .client import Client, high_water
from .context import INF
from .options import NSQDOptions
from .wire import ClientError

__all__ = ["Identify", "apply_identify", "negotiate", "parse_identify"]


@dataclass(frozen=True, slots=True)
class Identify:
    """IDENTIFY's fields after type checking (nsqd's ``identifyDataV2``)."""

    client_id: str
    hostname: str
    user_agent: str
    heartbeat_interval: int
    output_buffer_size: int
    output_buffer_timeout: int
    feature_negotiation: bool
    tls_v1: bool
    snappy: bool
    deflate: bool
    deflate_level: int
    sample_rate: int
    msg_timeout: int


def parse_identify(body: bytes) -> Identify:
    """Decode and type-check an IDENTIFY body."""
    failed = ClientError("E_BAD_BODY", "IDENTIFY failed to decode JSON body")
    try:
        data = json.loads(body)
    except (ValueError, RecursionError):
        raise failed from None
    if not isinstance(data, dict):
        raise failed

    def text(key: str, fallback: str = "") -> str:
        value = data.get(key)
        if value is None:
            return fallback
        if not isinstance(value, str):
            raise failed
        return value

    def integer(key: str) -> int:
        value = data.get(key)
        if value is None:
            return 0
        if isinstance(value, bool) or not isinstance(value, int):
            raise failed
        if not -(1 << 63) <= value < (1 << 63):
            raise failed
        return value

    def flag(key: str) -> bool:
        value = data.get(key)
        if value is None:
            return False
        if not isinstance(value, bool):
            raise failed
        return value

    client_id = text("client_id") or text("short_id")
    hostname = text("hostname") or text("long_id")
    return Identify(
        client_id=client_id,
        hostname=hostname,
        user_agent=text("user_agent"),
        heartbeat_interval=integer("heartbeat_interval"),
        output_buffer_size=integer("output_buffer_size"),
        output_buffer_timeout=integer("output_buffer_timeout"),
        feature_negotiation=flag("feature_negotiation"),
        tls_v1=flag("tls_v1"),
        snappy=flag("snappy"),
        deflate=flag("deflate"),
        deflate_level=integer("deflate_level"),
        sample_rate=integer("sample_rate"),
        msg_timeout=integer("msg_timeout"),
    )


def apply_identify(conn: Client, data: Identify, options: NSQDOptions, now: float) -> None:
    """Check IDENTIFY's settings against the node's limits and apply them to the client."""

    def invalid(what: str, value: int) -> ClientError:
        return ClientError("E_BAD_BODY", f"IDENTIFY {what} ({value}) is invalid")

    heartbeat = conn.heartbeat_interval
    if data.heartbeat_interval == -1:
        heartbeat = 0.0
    elif data.heartbeat_interval != 0:
        if not 1000 <= data.heartbeat_interval <= options.max_heartbeat_interval * 1000:
            raise invalid("heartbeat interval", data.heartbeat_interval)
        heartbeat = data.heartbeat_interval / 1000
    buffer_timeout = conn.output_buffer_timeout
    if data.output_buffer_timeout == -1:
        buffer_timeout = 0.0
    elif data.output_buffer_timeout != 0:
        low = options.min_output_buffer_timeout * 1000
        high = options.max_output_buffer_timeout * 1000
        if not low <= data.output_buffer_timeout <= high:
            raise invalid("output buffer timeout", data.output_buffer_timeout)
        buffer_timeout = data.output_buffer_timeout / 1000
    buffer_size = conn.output_buffer_size
    if data.output_buffer_size == -1:
        buffer_size = 1
        buffer_timeout = 0.0
    elif data.output_buffer_size != 0:
        if not 64 <= data.output_buffer_size <= options.max_output_buffer_size:
            raise invalid("output buffer size", data.output_buffer_size)
        buffer_size = data.output_buffer_size
    if not 0 <= data.sample_rate <= 99:
        raise invalid("sample rate", data.sample_rate)
    msg_timeout = conn.msg_timeout
    if data.msg_timeout != 0:
        if not 1000 <= data.msg_timeout <= options.max_msg_timeout * 1000:
            raise invalid("msg timeout", data.msg_timeout)
        msg_timeout = data.msg_timeout / 1000

    if data.client_id:
        conn.client_id = data.client_id
    if data.hostname:
        conn.hostname = data.hostname
    conn.user_agent = data.user_agent
    conn.heartbeat_interval = heartbeat
    conn.output_buffer_timeout = buffer_timeout
    conn.output_buffer_size = buffer_size
    conn.high_water = high_water(buffer_size)
    conn.sample_rate = data.sample_rate
    conn.msg_timeout = msg_timeout
    conn.next_heartbeat = now + heartbeat if heartbeat > 0 else INF


def negotiate(
    conn: Client, data: Identify, options: NSQDOptions
) -> tuple[dict[str, Any], bool, tuple[str, int] | None]:
    """Feature negotiation: the JSON answer, whether TLS follows, and the compression (kind,
    level) that starts once the answer (and TLS) is through."""
    compressed = conn.encoder is not None or conn.pending_compression is not None
    tls = options.tls_available and data.tls_v1 and not conn.tls
    deflate = options.deflate and data.deflate and not compressed
    deflate_level = data.deflate_level if deflate and data.deflate_level > 0 else 6
    deflate_level = min(deflate_level, options.max_deflate_level)
    snappy = options.snappy and data.snappy and not compressed
    if deflate and snappy:
        raise ClientError("E_IDENTIFY_FAILED", "cannot enable both deflate and snappy compression")
    answer = {
        "max_rdy_count": options.max_rdy_count,
        "version": options.version,
        "max_msg_timeout": int(options.max_msg_timeout * 1000),
        "msg_timeout": int(conn.msg_timeout * 1000),
        "tls_v1": tls,
        "deflate": deflate,
        "deflate_level": deflate_level,
        "max_deflate_level": options.max_deflate_level,
        "snappy": snappy,
        "sample_rate": conn.sample_rate,
        "auth_required": options.auth_enabled,
        "output_buffer_size": conn.output_buffer_size,
        "output_buffer_timeout": int(conn.output_buffer_timeout * 1000),
    }
    compression = ("snappy", 0) if snappy else ("deflate", deflate_level) if deflate else None
    return answer, tls, compression
