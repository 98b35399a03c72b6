"""nsqd's HTTP API over the pure core, answered as the real nsqd answers: the routes and the
methods each takes (:data:`NSQD_ROUTES`), :func:`route_nsqd` for one request (``/ping``,
``/info``, ``/stats`` in JSON or nsqd's text layout, ``/pub``, ``/mpub``, topic and channel
admin), and the tables behind ``/config/<option>`` (which options, which are durations, the
log levels). Serving the sockets is :class:`~transports.embedded.nsqd.EmbeddedNSQD`'s.
"""

from __future__ import annotations

import dataclasses
import logging
import struct
import time
from typing import Any

from nsq_sansio.errors import InvalidName
from nsq_sansio.names import validate_topic
from nsq_sansio.server.events import (
    AdminError,
    ServerEvent,
)
from nsq_sansio.server.nsqd import NSQD
from nsq_sansio.server.options import NSQDOptions

from .http import (
    HTTPRequest,
    HTTPResponse,
    empty_response,
    json_response,
    method_not_routed,
    plain_text_response,
    text_response,
)
from .memory import memory_stats

__all__ = [
    "CONFIG_DURATIONS",
    "CONFIG_METHODS",
    "CONFIG_OPTION_NAMES",
    "LOG_LEVELS",
    "NSQD_ROUTES",
    "PYTHON_LOG_LEVELS",
    "route_nsqd",
]

_OPTION_NAMES = {f.name for f in dataclasses.fields(NSQDOptions)}
_I32 = struct.Struct(">i")


_GET = frozenset({"GET"})
_POST = frozenset({"POST"})
#: nsqd's HTTP routes and the methods each takes (what the real one's router answers 405 to).
NSQD_ROUTES: dict[str, frozenset[str]] = {
    "/ping": _GET,
    "/info": _GET,
    "/stats": _GET,
    "/pub": _POST,
    "/mpub": _POST,
    "/topic/create": _POST,
    "/topic/delete": _POST,
    "/topic/empty": _POST,
    "/topic/pause": _POST,
    "/topic/unpause": _POST,
    "/channel/create": _POST,
    "/channel/delete": _POST,
    "/channel/empty": _POST,
    "/channel/pause": _POST,
    "/channel/unpause": _POST,
}


CONFIG_METHODS = frozenset({"GET", "PUT"})
# NSQDOptions fields that are nsqd options of the same config name; the durations among them.
CONFIG_OPTION_NAMES = _OPTION_NAMES - {
    "version",
    "hostname",
    "tcp_port",
    "http_port",
    "broadcast_address",
    "tls_available",
    "tls_required",
    "auth_check",
    "auth_by_transport",
    "max_command_line",
    "requeue_in_flight_on_close",
}
CONFIG_DURATIONS = {
    "msg_timeout",
    "max_msg_timeout",
    "max_req_timeout",
    "max_defer_timeout",
    "client_timeout",
    "max_heartbeat_interval",
    "max_output_buffer_timeout",
    "min_output_buffer_timeout",
    "output_buffer_timeout",
    "http_client_connect_timeout",
    "http_client_request_timeout",
    "e2e_processing_latency_window_time",
}
# nsqd's log levels (lg.LogLevel) and the Python logging level each sets on this module's
# logger, which every embedded nsqd of the process shares.
LOG_LEVELS = {"debug": 1, "info": 2, "warn": 3, "error": 4, "fatal": 5}
PYTHON_LOG_LEVELS = {
    1: logging.DEBUG,
    2: logging.INFO,
    3: logging.WARNING,
    4: logging.ERROR,
    5: logging.CRITICAL,
}
# nsqd's boolParams: other values leave the default (include_*) or mean binary (/mpub).
_BOOL_PARAMS = {"true": True, "1": True, "false": False, "0": False}


def route_nsqd(
    core: NSQD, request: HTTPRequest, now: float
) -> tuple[HTTPResponse, list[ServerEvent]]:
    """Answer one nsqd HTTP API request from the pure core; raises ``AdminError``."""
    path = request.path
    refused = method_not_routed(NSQD_ROUTES, request)
    if refused is not None:
        return refused, []
    opts = core.options
    events: list[ServerEvent]
    if path == "/ping":
        health = core.health
        return plain_text_response(health, 200 if health == "OK" else 500), []
    if path == "/info":
        return json_response(core.info()), []
    if path == "/stats":
        topic_filter = request.arg("topic") or None
        include_clients = _BOOL_PARAMS.get(request.arg("include_clients") or "", True)
        stats = core.stats(
            now,
            topic=topic_filter,
            channel=request.arg("channel") or None,
            include_clients=include_clients,
        )
        _as_go_nil_slices(
            stats,
            missing_topic=topic_filter is not None and topic_filter not in core.topic_names(),
            include_clients=include_clients,
        )
        if _BOOL_PARAMS.get(request.arg("include_mem") or "", True):
            stats["memory"] = memory_stats()
        if request.arg("format") == "json":
            return json_response(stats), []
        return text_response(_stats_text(stats, core.uptime(now))), []
    if path == "/pub":
        if request.body_too_large or len(request.body) > opts.max_msg_size:
            raise AdminError(413, "MSG_TOO_BIG")
        if not request.body:
            raise AdminError(400, "MSG_EMPTY")
        events = core.publish(
            _required_topic(request), request.body, now, defer_ms=_defer_ms(request)
        )
        return text_response("OK"), events
    if path == "/mpub":
        if request.body_too_large:
            raise AdminError(413, "BODY_TOO_BIG")
        topic = _required_topic(request)
        binary = request.arg("binary")
        if binary is not None and _BOOL_PARAMS.get(binary, True):
            bodies = _split_binary_mpub(request.body, opts.max_msg_size)
        else:
            bodies = [line for line in request.body.split(b"\n") if line]
            if any(len(b) > opts.max_msg_size for b in bodies):
                raise AdminError(413, "MSG_TOO_BIG")
        # no message: nsqd only makes the topic
        events = core.multi_publish(topic, bodies, now) if bodies else core.create_topic(topic, now)
        return text_response("OK"), events
    topic = _required_topic(request)
    channel = request.arg("channel")
    if path.startswith("/channel/") and channel is None:
        try:
            validate_topic(topic)
        except InvalidName:
            raise AdminError(400, "INVALID_ARG_TOPIC") from None
        raise AdminError(400, "MISSING_ARG_CHANNEL")
    events = []
    if path == "/topic/create":
        events = core.create_topic(topic, now)
    elif path == "/topic/delete":
        events = core.delete_topic(topic, now)
    elif path == "/topic/empty":
        core.empty_topic(topic, now)
    elif path == "/topic/pause":
        core.pause_topic(topic, now)
    elif path == "/topic/unpause":
        core.unpause_topic(topic, now)
    elif path == "/channel/create":
        core.create_channel(topic, channel or "", now)
    elif path == "/channel/delete":
        events = core.delete_channel(topic, channel or "", now)
    elif path == "/channel/empty":
        core.empty_channel(topic, channel or "", now)
    elif path == "/channel/pause":
        core.pause_channel(topic, channel or "", now)
    elif path == "/channel/unpause":
        core.unpause_channel(topic, channel or "", now)
    return empty_response(), events


def _as_go_nil_slices(stats: dict[str, Any], *, missing_topic: bool, include_clients: bool) -> None:
    """Where nsqd's /stats JSON has null (Go's nil slices) rather than the core's empty
    lists: "topics" (and "producers") for a topic asked for that does not exist, "producers"
    when there are none, each channel's "clients" when clients were not asked for."""
    if missing_topic:
        stats["topics"] = None
    if not include_clients:
        for topic in stats["topics"] or ():
            for channel in topic["channels"]:
                channel["clients"] = None
    if missing_topic or not stats["producers"]:
        stats["producers"] = None


def _required_topic(request: HTTPRequest) -> str:
    topic = request.arg("topic")
    if topic is None:
        raise AdminError(400, "MISSING_ARG_TOPIC")
    return topic


def _defer_ms(request: HTTPRequest) -> int:
    raw = request.arg("defer")
    if raw is None:
        return 0
    try:
        return int(raw, 10)
    except ValueError:
        raise AdminError(400, "INVALID_DEFER") from None


def _split_binary_mpub(body: bytes, max_msg_size: int) -> list[bytes]:
    """``[4-byte count]([4-byte size][body])*``, with nsqd's HTTP error codes."""
    if len(body) < 4:
        raise AdminError(413, "BAD_BODY", "MPUB failed to read message count")
    (count,) = _I32.unpack_from(body, 0)
    if count <= 0 or count > len(body):
        raise AdminError(413, "BAD_BODY", f"MPUB invalid message count {count}")
    pos = 4
    bodies: list[bytes] = []
    for i in range(count):
        if pos + 4 > len(body):
            raise AdminError(413, "BAD_MESSAGE", f"MPUB failed to read message({i}) body size")
        (size,) = _I32.unpack_from(body, pos)
        pos += 4
        if size <= 0 or size > max_msg_size:
            raise AdminError(413, "BAD_MESSAGE", f"MPUB invalid message({i}) body size {size}")
        if pos + size > len(body):
            raise AdminError(413, "BAD_MESSAGE", f"MPUB failed to read message({i}) body")
        bodies.append(body[pos : pos + size])
        pos += size
    return bodies


def _stats_text(stats: dict[str, Any], uptime: float) -> str:
    """``/stats`` as nsqd prints it without ``format=json`` (same layout, same columns)."""
    started = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(stats["start_time"]))
    out = [
        f"nsqd v{stats['version']} (nsq-sansio embedded)\n",
        f"start_time {started}\n",
        f"uptime {_go_duration(uptime)}\n",
        f"\nHealth: {stats['health']}\n",
    ]
    memory = stats.get("memory")
    if memory is not None:
        out.append("\nMemory:\n")
        out.extend(f"   {key:<25}\t{value}\n" for key, value in memory.items())
    topics = stats["topics"] or []
    out.append("\nTopics:" if topics else "\nTopics: None\n")
    for topic in topics:
        paused = "*P " if topic["paused"] else "   "
        out.append(
            f"\n{paused}[{topic['topic_name']:<15}] depth: {topic['depth']:<5} "
            f"be-depth: {topic['backend_depth']:<5} msgs: {topic['message_count']:<8} "
            f"e2e%: {_e2e_text(topic['e2e_processing_latency'])}\n"
        )
        for ch in topic["channels"]:
            paused = "   *P " if ch["paused"] else "      "
            out.append(
                f"{paused}[{ch['channel_name']:<25}] depth: {ch['depth']:<5} "
                f"be-depth: {ch['backend_depth']:<5} inflt: {ch['in_flight_count']:<4} "
                f"def: {ch['deferred_count']:<4} re-q: {ch['requeue_count']:<5} "
                f"timeout: {ch['timeout_count']:<5} msgs: {ch['message_count']:<8} "
                f"e2e%: {_e2e_text(ch['e2e_processing_latency'])}\n"
            )
            out.extend(f"        {_client_text(c)}\n" for c in ch["clients"] or ())
    producers = stats["producers"] or []
    out.append("\nProducers:\n" if producers else "\nProducers: None\n")
    out.extend(f"   {_client_text(client)}\n" for client in producers)
    return "".join(out)


def _e2e_text(latency: dict[str, Any]) -> str:
    """The percentiles of an ``e2e_processing_latency`` as nsqd's text /stats prints them
    (``1.9s, 12.5ms``; nothing when they are not tracked)."""
    return ", ".join(_nanoseconds_text(p["value"]) for p in latency["percentiles"] or ())


def _nanoseconds_text(value: float) -> str:
    for scale, suffix in ((1e9, "s"), (1e6, "ms"), (1e3, "us")):
        if value > scale:
            return f"{value / scale:.1f}{suffix}"
    return f"{value:.1f}ns"


def _client_text(client: dict[str, Any]) -> str:
    """One client line of the text /stats (nsqd's ``ClientV2Stats.String``)."""
    connected = max(0, int(time.time()) - int(client["connect_ts"]))
    port = str(client["remote_address"]).rsplit(":", 1)[-1]
    ident = f"{client['hostname']}:{port} {client['user_agent']}"
    head = f"[{client['version']} {ident:<21}]"
    counts = client.get("pub_counts")
    if counts:
        total = sum(entry["count"] for entry in counts)
        topics = ",".join(f"{entry['topic']}={entry['count']}" for entry in counts)
        return f"{head} msgs: {total:<8} topics: {topics} connected: {_go_duration(connected)}"
    return (
        f"{head} state: {client['state']} inflt: {client['in_flight_count']:<4} "
        f"rdy: {client['ready_count']:<4} fin: {client['finish_count']:<8} "
        f"re-q: {client['requeue_count']:<8} msgs: {client['message_count']:<8} "
        f"connected: {_go_duration(connected)}"
    )


def _go_duration(seconds: float) -> str:
    """Go's ``time.Duration.String`` for the values /stats prints (``1h2m3s``, ``2.5s``,
    ``350ms``, ``0s``)."""
    if seconds <= 0:
        return "0s"
    if seconds < 1:
        millis = seconds * 1000
        return f"{millis:.6f}".rstrip("0").rstrip(".") + "ms"
    whole = int(seconds)
    hours, rest = divmod(whole, 3600)
    minutes, secs = divmod(rest, 60)
    fraction = f"{seconds - whole:.9f}"[1:].rstrip("0").rstrip(".")
    out = f"{secs}{fraction}s"
    if hours or minutes:
        out = f"{minutes}m" + out
    if hours:
        out = f"{hours}h" + out
    return out
