"""What the streaming source asks nsqd over HTTP: a channel's counts (``/stats``), one of its
settings (``/config/<name>``), and where each nsqd's HTTP port is.

The source needs three facts the TCP protocol does not give: how many messages a channel holds
(so that ``availableNow`` reads what was there at its start, and the query's progress shows the
lag), whether messages of a closed connection are still waiting for nsqd's timeout (so that a
restarted source knows when a committed batch can no longer come back), and nsqd's
``--max-msg-size`` (so that a message always fits in a Spark task). :func:`channel_counts` is
the one function that reads ``/stats``; an admin client can take its place.

Every answer is read up to :data:`MAX_ANSWER` bytes. A failure (nsqd unreachable, no HTTP
address known, a bad answer) gives ``None``: callers then fall back to what they can do without.
"""

from __future__ import annotations

import json
import ssl
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from nsq_sansio.discovery import MAX_RESPONSE_SIZE, LookupdAddress, NSQDAddress

__all__ = [
    "MAX_ANSWER",
    "ChannelCounts",
    "NSQDView",
    "channel_counts",
    "config_value",
    "guess_http_address",
    "http_addresses_from_lookupd",
    "read_capped",
]

#: Largest HTTP answer read (as the core's lookupd client): a channel's stats fit in far less.
MAX_ANSWER = MAX_RESPONSE_SIZE


@dataclass(frozen=True, slots=True)
class ChannelCounts:
    """One channel on one nsqd, from its ``/stats``."""

    depth: int  # queued: in memory and on disk
    in_flight: int  # sent to a consumer, not answered yet
    deferred: int  # requeued with a delay, or published deferred
    #: in flight at no connected client: a closed connection's messages, which nsqd gives
    #: back only when their timeout passes
    orphaned: int
    requeued: int  # REQs since the channel was created
    timed_out: int  # messages nsqd took back after their timeout, since then
    clients: int
    paused: bool = False

    @property
    def may_still_deliver(self) -> int:
        """Messages nsqd may still hand to a consumer without anyone answering first."""
        return self.depth + self.orphaned


def read_capped(response: Any, what: str) -> bytes:
    """An HTTP answer's body, refused (ValueError) above :data:`MAX_ANSWER` bytes."""
    body: bytes = response.read(MAX_ANSWER + 1)
    if len(body) > MAX_ANSWER:
        raise ValueError(f"{what}: answer over {MAX_ANSWER} bytes")
    return body


def _url(http_address: str, path: str) -> str:
    base = http_address if "://" in http_address else f"http://{http_address}"
    return base.rstrip("/") + path


def _get_json(url: str, timeout: float, context: ssl.SSLContext | None) -> Any:
    try:
        with urllib.request.urlopen(url, timeout=timeout, context=context) as response:
            body = read_capped(response, url)
    except urllib.error.HTTPError as exc:
        exc.close()
        return None
    except (OSError, ValueError):
        return None
    try:
        return json.loads(body)
    except (ValueError, RecursionError):
        return None


def _int(value: Any) -> int:
    return value if isinstance(value, int) and not isinstance(value, bool) else 0


def channel_counts(
    http_address: str,
    topic: str,
    channel: str,
    *,
    timeout: float,
    context: ssl.SSLContext | None = None,
) -> ChannelCounts | None:
    """``topic``/``channel``'s counts on the nsqd at ``http_address``: zeros when the channel
    does not exist, None when nsqd could not be asked."""
    query = urllib.parse.urlencode(
        {"format": "json", "topic": topic, "channel": channel, "include_mem": "false"}
    )
    document = _get_json(_url(http_address, f"/stats?{query}"), timeout, context)
    if isinstance(document, dict) and isinstance(document.get("data"), dict):
        document = document["data"]  # nsqd before 1.0 wrapped its answers
    if not isinstance(document, dict):
        return None
    for entry in document.get("topics") or ():
        if not isinstance(entry, dict) or entry.get("topic_name") != topic:
            continue
        for found in entry.get("channels") or ():
            if not isinstance(found, dict) or found.get("channel_name") != channel:
                continue
            clients = [c for c in found.get("clients") or () if isinstance(c, dict)]
            in_flight = _int(found.get("in_flight_count"))
            held = sum(_int(c.get("in_flight_count")) for c in clients)
            return ChannelCounts(
                depth=_int(found.get("depth")),
                in_flight=in_flight,
                deferred=_int(found.get("deferred_count")),
                orphaned=max(0, in_flight - held),
                requeued=_int(found.get("requeue_count")),
                timed_out=_int(found.get("timeout_count")),
                clients=len(clients),
                paused=found.get("paused") is True,
            )
    return ChannelCounts(0, 0, 0, 0, 0, 0, 0)


def config_value(
    http_address: str, name: str, *, timeout: float, context: ssl.SSLContext | None = None
) -> Any:
    """nsqd's setting ``name`` (``GET /config/<name>``, e.g. ``max_msg_size``); None when
    unknown."""
    return _get_json(_url(http_address, f"/config/{urllib.parse.quote(name)}"), timeout, context)


def guess_http_address(
    tcp_address: str, *, timeout: float, context: ssl.SSLContext | None = None
) -> str | None:
    """nsqd's HTTP address when it follows nsqd's default layout (the TCP port + 1, as 4150 and
    4151), checked by asking it (``/info`` names its TCP port); None otherwise."""
    address = NSQDAddress.parse(tcp_address)
    if address.port >= 65535:
        return None
    host = f"[{address.host}]" if ":" in address.host else address.host
    candidate = f"{host}:{address.port + 1}"
    info = _get_json(_url(candidate, "/info"), timeout, context)
    if isinstance(info, dict) and isinstance(info.get("data"), dict):
        info = info["data"]
    if isinstance(info, dict) and info.get("tcp_port") == address.port:
        return candidate
    return None


def http_addresses_from_lookupd(
    lookupd: Iterable[str],
    topic: str,
    *,
    timeout: float,
    context: ssl.SSLContext | None = None,
) -> dict[str, str]:
    """``{nsqd TCP address: its HTTP address}`` for every nsqd the lookupd list for ``topic``
    (``/lookup``: broadcast address, TCP and HTTP ports)."""
    found: dict[str, str] = {}
    for text in lookupd:
        address = LookupdAddress.parse(text)
        query = urllib.parse.urlencode({"topic": topic})
        document = _get_json(f"{address}/lookup?{query}", timeout, context)
        if isinstance(document, dict) and isinstance(document.get("data"), dict):
            document = document["data"]
        if not isinstance(document, dict):
            continue
        for producer in document.get("producers") or ():
            if isinstance(producer, Mapping):
                _add_producer(found, producer)
    return found


def _add_producer(found: dict[str, str], producer: Mapping[str, Any]) -> None:
    host = producer.get("broadcast_address")
    tcp, http = producer.get("tcp_port"), producer.get("http_port")
    if not isinstance(host, str) or not host or any(c in host for c in " /[]\r\n\t"):
        return
    if not (isinstance(tcp, int) and isinstance(http, int)) or isinstance(tcp, bool):
        return
    if not (1 <= tcp <= 65535 and 1 <= http <= 65535):
        return
    shown = f"[{host}]" if ":" in host else host
    found[f"{shown}:{tcp}"] = f"{shown}:{http}"


class NSQDView:
    """The HTTP side of the nsqd a source reads from: where each one's HTTP port is (option
    ``nsqd_http``, else the lookupd's answer, else nsqd's default layout, checked), and its
    channel counts. Driver only; every method gives None when it cannot tell."""

    #: Seconds between two lookupd queries for an nsqd not known yet.
    REFRESH = 30.0

    def __init__(
        self,
        *,
        topic: str,
        channel: str,
        nsqd: tuple[str, ...],
        nsqd_http: tuple[str, ...],
        lookupd: tuple[str, ...],
        timeout: float,
        context: ssl.SSLContext | None = None,
    ) -> None:
        self.topic = topic
        self.channel = channel
        self._nsqd = nsqd
        self._lookupd = lookupd
        self._timeout = timeout
        self._context = context
        self._http: dict[str, str | None] = dict(zip(nsqd, nsqd_http, strict=False))
        self._from_lookupd: dict[str, str] = {}
        self._asked_lookupd_at: float | None = None

    def nodes(self, now: float) -> list[str]:
        """The nsqd TCP addresses that serve the topic: the ``nsqd`` option's, and those the
        lookupd list."""
        if self._lookupd:
            self._ask_lookupd(now, force=True)
        return sorted({*self._nsqd, *self._from_lookupd})

    def _ask_lookupd(self, now: float, force: bool = False) -> None:
        if not self._lookupd:
            return
        last = self._asked_lookupd_at
        if not force and last is not None and now - last < self.REFRESH:
            return
        self._asked_lookupd_at = now
        self._from_lookupd.update(
            http_addresses_from_lookupd(
                self._lookupd, self.topic, timeout=self._timeout, context=self._context
            )
        )

    def http_for(self, tcp_address: str, now: float) -> str | None:
        """The HTTP address of the nsqd at ``tcp_address``, or None."""
        if tcp_address in self._http:
            return self._http[tcp_address]
        if tcp_address not in self._from_lookupd:
            self._ask_lookupd(now)
        found = self._from_lookupd.get(tcp_address)
        if found is None and tcp_address not in self._from_lookupd:
            try:
                found = guess_http_address(
                    tcp_address, timeout=self._timeout, context=self._context
                )
            except ValueError:
                found = None
        self._http[tcp_address] = found
        return found

    def counts(self, tcp_address: str, now: float) -> ChannelCounts | None:
        """The channel's counts on that nsqd (see :func:`channel_counts`)."""
        http = self.http_for(tcp_address, now)
        if http is None:
            return None
        return channel_counts(
            http, self.topic, self.channel, timeout=self._timeout, context=self._context
        )

    def max_msg_size(self, tcp_address: str, now: float) -> int | None:
        """That nsqd's ``--max-msg-size``, when it says."""
        http = self.http_for(tcp_address, now)
        if http is None:
            return None
        value = config_value(http, "max_msg_size", timeout=self._timeout, context=self._context)
        return value if isinstance(value, int) and not isinstance(value, bool) else None
