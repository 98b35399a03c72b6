"""JSON answers into :mod:`.answers` dataclasses, checked field by field: a wrong type
anywhere is an :class:`~.errors.AdminResponseError` naming the field
(``topics[0].channels[2].depth``), whatever the JSON; absent fields and nulls (an older
nsqd, Go's nil slices) read as empty or 0. The envelope nsqd and nsqlookupd used before 1.0
(``status_code``/``status_txt``/``data``) is taken off."""

from __future__ import annotations

import json
import math
from collections.abc import Callable
from typing import Any

from .answers import (
    ChannelStats,
    ClientStats,
    E2ELatency,
    LatencyPercentile,
    LookupdInfo,
    LookupdNode,
    LookupdProducer,
    MemoryStats,
    NSQDInfo,
    NSQDStats,
    PubCount,
    TopicLookup,
    TopicStats,
)
from .errors import AdminResponseError

__all__ = [
    "names_parser",
    "parse_lookupd_info",
    "parse_lookupd_nodes",
    "parse_nsqd_info",
    "parse_nsqd_stats",
    "parse_topic_lookup",
]


class _Obj:
    """A JSON object read field by field with checked types; errors name the field's path."""

    __slots__ = ("_data", "_path")

    def __init__(self, data: object, path: str) -> None:
        if not isinstance(data, dict):
            raise AdminResponseError(f"{path or 'answer'}: expected an object, got {_kind(data)}")
        self._data: dict[str, Any] = data
        self._path = path

    def _where(self, key: str) -> str:
        return f"{self._path}.{key}" if self._path else key

    def integer(self, key: str, default: int = 0) -> int:
        value = self._data.get(key)
        if value is None:
            return default
        if isinstance(value, bool) or not isinstance(value, int):
            raise AdminResponseError(f"{self._where(key)}: expected an integer, got {_kind(value)}")
        return value

    def number(self, key: str) -> float:
        value = self._data.get(key)
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise AdminResponseError(f"{self._where(key)}: expected a number, got {_kind(value)}")
        try:
            result = float(value)
        except OverflowError:
            raise AdminResponseError(f"{self._where(key)}: number out of range") from None
        if not math.isfinite(result):
            raise AdminResponseError(f"{self._where(key)}: expected a finite number")
        return result

    def text(self, key: str, default: str = "") -> str:
        value = self._data.get(key)
        if value is None:
            return default
        if not isinstance(value, str):
            raise AdminResponseError(f"{self._where(key)}: expected a string, got {_kind(value)}")
        return value

    def name(self, key: str) -> str:
        value = self.text(key)
        if not value:
            raise AdminResponseError(f"{self._where(key)}: missing")
        return value

    def flag(self, key: str, default: bool = False) -> bool:
        value = self._data.get(key)
        if value is None:
            return default
        if not isinstance(value, bool):
            raise AdminResponseError(f"{self._where(key)}: expected true/false, got {_kind(value)}")
        return value

    def array(self, key: str) -> list[Any]:
        """A list, or [] for a missing key or null (Go's nil slice)."""
        value = self._data.get(key)
        if value is None:
            return []
        if not isinstance(value, list):
            raise AdminResponseError(f"{self._where(key)}: expected a list, got {_kind(value)}")
        return value

    def objects(self, key: str) -> list[_Obj]:
        where = self._where(key)
        return [_Obj(item, f"{where}[{i}]") for i, item in enumerate(self.array(key))]

    def strings(self, key: str) -> list[str]:
        items = self.array(key)
        for i, item in enumerate(items):
            if not isinstance(item, str):
                raise AdminResponseError(
                    f"{self._where(key)}[{i}]: expected a string, got {_kind(item)}"
                )
        return items

    def optional(self, key: str) -> _Obj | None:
        value = self._data.get(key)
        return None if value is None else _Obj(value, self._where(key))


def _kind(value: object) -> str:
    """How an error names a JSON value: its kind, and a short repr of a scalar."""
    if value is None:
        return "null"
    if isinstance(value, list):
        return "a list"
    if isinstance(value, dict):
        return "an object"
    kind = {bool: "a boolean", int: "an integer", float: "a number"}.get(type(value), "a string")
    return f"{kind} {value!r:.40}"


def _document(body: bytes) -> object:
    """The JSON of an answer, without the envelope nsqd and nsqlookupd used before 1.0
    (``{"status_code": 200, "status_txt": "OK", "data": {...}}``)."""
    try:
        document = json.loads(body)
    except (ValueError, RecursionError):
        raise AdminResponseError(f"not JSON: {body[:80]!r}") from None
    if isinstance(document, dict) and "status_code" in document and "data" in document:
        return document["data"]
    return document


def _seconds(obj: _Obj, key: str, scale: float = 1e9) -> float:
    """A duration nsqd gives in nanoseconds (Go's ``time.Duration``), in seconds."""
    value = obj.integer(key)
    try:
        return value / scale
    except OverflowError:
        raise AdminResponseError(f"{obj._where(key)}: number out of range") from None


def _latency(obj: _Obj) -> E2ELatency | None:
    found = obj.optional("e2e_processing_latency")
    if found is None:
        return None
    entries = found.objects("percentiles")
    if not entries:
        return None
    percentiles = tuple(
        LatencyPercentile(entry.number("quantile"), _seconds(entry, "value")) for entry in entries
    )
    return E2ELatency(found.integer("count"), percentiles)


def _client(obj: _Obj) -> ClientStats:
    return ClientStats(
        client_id=obj.text("client_id"),
        hostname=obj.text("hostname"),
        version=obj.text("version"),
        remote_address=obj.text("remote_address"),
        state=obj.integer("state"),
        ready_count=obj.integer("ready_count"),
        in_flight_count=obj.integer("in_flight_count"),
        message_count=obj.integer("message_count"),
        finish_count=obj.integer("finish_count"),
        requeue_count=obj.integer("requeue_count"),
        connect_ts=obj.integer("connect_ts"),
        sample_rate=obj.integer("sample_rate"),
        deflate=obj.flag("deflate"),
        snappy=obj.flag("snappy"),
        user_agent=obj.text("user_agent"),
        tls=obj.flag("tls"),
        tls_cipher_suite=obj.text("tls_cipher_suite"),
        tls_version=obj.text("tls_version"),
        tls_negotiated_protocol=obj.text("tls_negotiated_protocol"),
        tls_negotiated_protocol_is_mutual=obj.flag("tls_negotiated_protocol_is_mutual"),
        authed=obj.flag("authed"),
        auth_identity=obj.text("auth_identity"),
        auth_identity_url=obj.text("auth_identity_url"),
        pub_counts=tuple(
            PubCount(entry.text("topic"), entry.integer("count"))
            for entry in obj.objects("pub_counts")
        ),
    )


def _channel(obj: _Obj, topic: str, topic_depth: int) -> ChannelStats:
    clients = tuple(_client(c) for c in obj.objects("clients"))
    return ChannelStats(
        topic=topic,
        name=obj.name("channel_name"),
        depth=obj.integer("depth"),
        backend_depth=obj.integer("backend_depth"),
        in_flight_count=obj.integer("in_flight_count"),
        deferred_count=obj.integer("deferred_count"),
        message_count=obj.integer("message_count"),
        requeue_count=obj.integer("requeue_count"),
        timeout_count=obj.integer("timeout_count"),
        client_count=obj.integer("client_count", len(clients)),
        paused=obj.flag("paused"),
        clients=clients,
        e2e_latency=_latency(obj),
        topic_depth=topic_depth,
    )


def _topic(obj: _Obj) -> TopicStats:
    name = obj.name("topic_name")
    depth = obj.integer("depth")
    channels = tuple(_channel(c, name, depth) for c in obj.objects("channels"))
    return TopicStats(
        name=name,
        depth=depth,
        backend_depth=obj.integer("backend_depth"),
        message_count=obj.integer("message_count"),
        message_bytes=obj.integer("message_bytes"),
        paused=obj.flag("paused"),
        channels=tuple(sorted(channels, key=lambda c: c.name)),
        e2e_latency=_latency(obj),
    )


def _memory(obj: _Obj | None) -> MemoryStats | None:
    if obj is None:
        return None
    return MemoryStats(
        heap_objects=obj.integer("heap_objects"),
        heap_idle_bytes=obj.integer("heap_idle_bytes"),
        heap_in_use_bytes=obj.integer("heap_in_use_bytes"),
        heap_released_bytes=obj.integer("heap_released_bytes"),
        gc_pause_usec_100=obj.integer("gc_pause_usec_100"),
        gc_pause_usec_99=obj.integer("gc_pause_usec_99"),
        gc_pause_usec_95=obj.integer("gc_pause_usec_95"),
        next_gc_bytes=obj.integer("next_gc_bytes"),
        gc_total_runs=obj.integer("gc_total_runs"),
    )


def parse_nsqd_stats(body: bytes) -> NSQDStats:
    """``/stats?format=json`` as :class:`NSQDStats`; :class:`AdminResponseError` otherwise."""
    obj = _Obj(_document(body), "")
    topics = tuple(_topic(t) for t in obj.objects("topics"))
    return NSQDStats(
        version=obj.text("version"),
        health=obj.text("health", "OK"),
        start_time=obj.integer("start_time"),
        topics=tuple(sorted(topics, key=lambda t: t.name)),
        producers=tuple(_client(c) for c in obj.objects("producers")),
        memory=_memory(obj.optional("memory")),
    )


def parse_nsqd_info(body: bytes) -> NSQDInfo:
    """``/info`` of nsqd as :class:`NSQDInfo`."""
    obj = _Obj(_document(body), "")
    return NSQDInfo(
        version=obj.text("version"),
        broadcast_address=obj.text("broadcast_address"),
        hostname=obj.text("hostname"),
        http_port=obj.integer("http_port"),
        tcp_port=obj.integer("tcp_port"),
        start_time=obj.integer("start_time"),
        max_heartbeat_interval=_seconds(obj, "max_heartbeat_interval"),
        max_output_buffer_size=obj.integer("max_output_buffer_size"),
        max_output_buffer_timeout=_seconds(obj, "max_output_buffer_timeout"),
        max_deflate_level=obj.integer("max_deflate_level"),
    )


def parse_lookupd_info(body: bytes) -> LookupdInfo:
    """``/info`` of nsqlookupd as :class:`LookupdInfo`."""
    return LookupdInfo(_Obj(_document(body), "").text("version"))


def names_parser(key: str) -> Callable[[bytes], tuple[str, ...]]:
    def parse(body: bytes) -> tuple[str, ...]:
        return tuple(sorted(set(_Obj(_document(body), "").strings(key))))

    return parse


def _producer_fields(obj: _Obj) -> dict[str, Any]:
    return {
        "remote_address": obj.text("remote_address"),
        "hostname": obj.text("hostname"),
        # nsqlookupd before 1.0 called it "address"
        "broadcast_address": obj.text("broadcast_address") or obj.text("address"),
        "tcp_port": obj.integer("tcp_port"),
        "http_port": obj.integer("http_port"),
        "version": obj.text("version"),
    }


def parse_lookupd_nodes(body: bytes) -> tuple[LookupdNode, ...]:
    """``/nodes`` as :class:`LookupdNode` entries, sorted by HTTP address."""
    nodes: list[LookupdNode] = []
    for entry in _Obj(_document(body), "").objects("producers"):
        topics = entry.strings("topics")
        flags = entry.array("tombstones")
        for i, flag in enumerate(flags):
            if not isinstance(flag, bool):
                raise AdminResponseError(f"tombstones[{i}]: expected true/false, got {_kind(flag)}")
        tombstoned = tuple(t for t, flag in zip(topics, flags, strict=False) if flag)
        nodes.append(
            LookupdNode(
                **_producer_fields(entry),
                topics=tuple(sorted(topics)),
                tombstoned_topics=tuple(sorted(tombstoned)),
            )
        )
    return tuple(sorted(nodes, key=lambda n: (n.http_address, n.tcp_port)))


def parse_topic_lookup(topic: str, body: bytes) -> TopicLookup:
    """``/lookup?topic=`` as :class:`TopicLookup` (producers sorted by HTTP address)."""
    obj = _Obj(_document(body), "")
    producers = [LookupdProducer(**_producer_fields(p)) for p in obj.objects("producers")]
    return TopicLookup(
        topic=topic,
        channels=tuple(sorted(set(obj.strings("channels")))),
        producers=tuple(sorted(producers, key=lambda p: (p.http_address, p.tcp_port))),
    )
