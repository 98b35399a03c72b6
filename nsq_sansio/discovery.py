"""nsqlookupd discovery, pure: build ``GET /lookup?topic=...``, parse the answer, poll.

* :class:`NSQDAddress` / :class:`LookupdAddress` parse and print addresses (IPv6 bracketed).
* :class:`LookupRequest` is one HTTP exchange over :class:`~nsq_sansio.http_client.HTTPClient`
  (the project's one HTTP client): ``data`` is what to write, :meth:`LookupRequest.receive_data`
  takes what was read (``b""`` at EOF) and returns the outcome once the response is complete.
  The body is bounded; garbage is an error, never a hang.
* :func:`parse_lookup_response` reads both answer shapes: nsqlookupd's current one
  (``{"channels": [...], "producers": [...]}``) and the old envelope
  (``{"status_code": 200, "status_txt": "OK", "data": {...}}``). ``404 TOPIC_NOT_FOUND`` is a
  valid answer with no producers. Producers are keyed by ``broadcast_address:tcp_port``.
* :class:`LookupdPoller` polls every lookupd: all at start (bootstrap), then each one every
  ``interval`` plus a random jitter of up to ``jitter * interval``. A request unanswered after
  ``timeout`` fails. A failing lookupd keeps its last good answer, so it never removes nodes
  from the union (:meth:`LookupdPoller.known_nodes`).
* :data:`NSQDFilter` is what a consumer may be given to decide which of the nsqd addresses a
  lookupd lists it connects to (go-nsq's ``DiscoveryFilter``); :func:`allow_nsqd` builds one
  from an allow-list of hosts, addresses and networks.
"""

from __future__ import annotations

import ipaddress
import json
import random
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from urllib.parse import quote, urlsplit

from .errors import ConfigError, ConnectionLost, LookupdError, RemoteProtocolError
from .http_client import HTTPClient
from .names import validate_topic

__all__ = [
    "LookupAnswer",
    "LookupFailure",
    "LookupRequest",
    "LookupdAddress",
    "LookupdError",
    "LookupdPoller",
    "NSQDAddress",
    "NSQDFilter",
    "PollRequest",
    "allow_nsqd",
    "parse_lookup_response",
]

#: Largest lookup answer accepted (a few thousand producers fit in far less).
MAX_RESPONSE_SIZE = 4 * 1024 * 1024


def _split_host_port(text: str, default_port: int | None, what: str) -> tuple[str, int]:
    host, port_text = text, ""
    if text.startswith("["):
        end = text.find("]")
        if end < 0:
            raise ConfigError(f"{what} address {text!r}: unclosed '[' in IPv6 address")
        host, rest = text[1:end], text[end + 1 :]
        if rest:
            if not rest.startswith(":"):
                raise ConfigError(f"{what} address {text!r}: expected ':port' after ']'")
            port_text = rest[1:]
    elif text.count(":") == 1:
        host, port_text = text.split(":")
    elif text.count(":") > 1:
        raise ConfigError(f"{what} address {text!r}: write IPv6 addresses as [host]:port")
    if not host:
        raise ConfigError(f"{what} address {text!r} has no host")
    if not port_text:
        if default_port is None:
            raise ConfigError(f"{what} address {text!r} needs a port (host:port)")
        return host, default_port
    if not port_text.isdigit() or not 1 <= int(port_text) <= 65535:
        raise ConfigError(f"{what} address {text!r}: port must be 1..65535")
    return host, int(port_text)


def _join(host: str, port: int) -> str:
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


@dataclass(frozen=True, slots=True)
class NSQDAddress:
    """An nsqd TCP address; ``str()`` gives the ``broadcast_address:tcp_port`` key."""

    host: str
    port: int

    def __str__(self) -> str:
        return _join(self.host, self.port)

    @classmethod
    def parse(cls, text: str | NSQDAddress) -> NSQDAddress:
        """``"host:port"`` or ``"[v6]:port"`` (the port is required)."""
        if isinstance(text, NSQDAddress):
            return text
        host, port = _split_host_port(text.strip(), None, "nsqd")
        return cls(host, port)


#: Which of the nsqd addresses a lookupd lists a consumer connects to: called with each one,
#: True to connect. Pure (no IO, no DNS: it sees the address as the lookupd wrote it) and
#: quick. Addresses given to the consumer directly (``nsqd=``) are not filtered.
NSQDFilter = Callable[[NSQDAddress], bool]


def allow_nsqd(*allowed: str) -> NSQDFilter:
    """An :data:`NSQDFilter` that connects only to the nsqd ``allowed`` names.

    Each entry is a host name (``"nsqd-1.internal"``, matched exactly, case aside), an IP
    address (``"10.0.0.7"``, ``"::1"``) or a network (``"10.0.0.0/8"``, ``"fd00::/8"``); a
    host name or an IP address may carry a port (``"nsqd-1.internal:4150"``,
    ``"[::1]:4150"``), and then only that port matches. A network matches IP addresses only:
    a name a lookupd lists is never resolved to be checked (DNS would then decide instead of
    the list). A bad entry, or none at all, is a :class:`~nsq_sansio.errors.ConfigError`.
    """
    return _AllowList(allowed)


class _AllowList:
    """:func:`allow_nsqd`'s filter: names, addresses and networks, each with a port or not."""

    __slots__ = ("_entries", "_ips", "_names", "_networks")

    def __init__(self, allowed: Sequence[str]) -> None:
        if not allowed:
            raise ConfigError("allow_nsqd() needs at least one host, address or network")
        self._entries = tuple(allowed)
        self._names: set[tuple[str, int | None]] = set()
        self._ips: set[tuple[ipaddress.IPv4Address | ipaddress.IPv6Address, int | None]] = set()
        self._networks: list[ipaddress.IPv4Network | ipaddress.IPv6Network] = []
        for entry in allowed:
            if not isinstance(entry, str) or not entry.strip():
                raise ConfigError(
                    f"allow_nsqd entry {entry!r}: expected a host, address or network"
                )
            text = entry.strip()
            if "/" in text:
                try:
                    self._networks.append(ipaddress.ip_network(text, strict=False))
                except ValueError:
                    raise ConfigError(
                        f"allow_nsqd entry {entry!r}: not a network (such as 10.0.0.0/8)"
                    ) from None
                continue
            host, port = _entry_host_port(text)
            ip = _ip(host)
            if ip is not None:
                self._ips.add((ip, port))
            elif not host or any(c in host for c in " /[]\r\n\t@"):
                raise ConfigError(f"allow_nsqd entry {entry!r}: not a host name or address")
            else:
                self._names.add((_name(host), port))

    def __call__(self, address: NSQDAddress) -> bool:
        ip = _ip(address.host)
        if ip is None:
            name = _name(address.host)
            return (name, None) in self._names or (name, address.port) in self._names
        if (ip, None) in self._ips or (ip, address.port) in self._ips:
            return True
        return any(ip in network for network in self._networks)

    def __repr__(self) -> str:
        return f"allow_nsqd({', '.join(map(repr, self._entries))})"


def _entry_host_port(text: str) -> tuple[str, int | None]:
    """An allow-list entry's host and port (None: any port); a bare IPv6 address has none."""
    if _ip(text) is not None:
        return text, None
    if text.startswith("[") or text.count(":") == 1:
        try:
            host, port = _split_host_port(text, 0, "allow_nsqd")
        except ConfigError as exc:
            raise ConfigError(f"allow_nsqd entry {text!r}: {exc}") from None
        return host, port or None
    return text, None


def _ip(host: str) -> ipaddress.IPv4Address | ipaddress.IPv6Address | None:
    try:
        return ipaddress.ip_address(host)
    except ValueError:
        return None


def _name(host: str) -> str:
    return host.lower().rstrip(".")


@dataclass(frozen=True, slots=True)
class LookupdAddress:
    """An nsqlookupd HTTP endpoint; ``tls`` means the transport must speak HTTPS."""

    host: str
    port: int
    tls: bool = False
    path_prefix: str = ""

    def __str__(self) -> str:
        scheme = "https" if self.tls else "http"
        return f"{scheme}://{_join(self.host, self.port)}{self.path_prefix}"

    @classmethod
    def parse(cls, text: str | LookupdAddress) -> LookupdAddress:
        """``"http://host:4161"``, ``"https://host"`` or ``"host:4161"`` (port 4161 by default)."""
        if isinstance(text, LookupdAddress):
            return text
        raw = text.strip()
        if "://" not in raw:
            raw = "http://" + raw
        parts = urlsplit(raw)
        if "@" in parts.netloc:  # said without the address: before "@" may be a password
            raise ConfigError(
                "a lookupd address with a user or password is not supported (nsqlookupd's "
                "HTTP API has no authentication); give http(s)://host:port only"
            )
        if parts.scheme not in ("http", "https"):
            raise ConfigError(f"lookupd address {text!r}: scheme must be http or https")
        if parts.query or parts.fragment:
            raise ConfigError(f"lookupd address {text!r}: no query or fragment allowed")
        tls = parts.scheme == "https"
        host, port = _split_host_port(parts.netloc, 443 if tls else 4161, "lookupd")
        prefix = parts.path.rstrip("/")
        if prefix.endswith("/lookup"):
            prefix = prefix[: -len("/lookup")]
        return cls(host, port, tls, prefix)


@dataclass(frozen=True, slots=True)
class LookupAnswer:
    """A lookupd's producers for the topic; ``skipped`` counts malformed producer entries."""

    lookupd: LookupdAddress
    producers: tuple[NSQDAddress, ...]
    skipped: int = 0


@dataclass(frozen=True, slots=True)
class LookupFailure:
    """A lookupd could not be asked or answered badly; it is skipped until its next poll."""

    lookupd: LookupdAddress
    error: LookupdError


@dataclass(frozen=True, slots=True)
class PollRequest:
    """Send ``data`` to ``lookupd`` and feed the answer back under ``request_id``."""

    request_id: int
    lookupd: LookupdAddress
    data: bytes


def parse_lookup_response(
    lookupd: LookupdAddress, status: int, body: bytes
) -> LookupAnswer | LookupFailure:
    """Turn a lookup answer (HTTP status and body) into producers or a failure."""
    try:
        document = json.loads(body) if body.strip() else None
    except (ValueError, RecursionError) as exc:  # bad or absurdly nested JSON
        return _failure(lookupd, f"answered {status} with a body that is not JSON: {exc}", status)
    if isinstance(document, dict) and "status_code" in document and status == 200:
        inner_status = document.get("status_code")
        if not isinstance(inner_status, int) or isinstance(inner_status, bool):
            return _failure(lookupd, f"bad status_code {inner_status!r} in the answer", status)
        status, message, document = inner_status, document.get("status_txt"), document.get("data")
    else:
        message = document.get("message") if isinstance(document, dict) else None
    if status == 404 and message == "TOPIC_NOT_FOUND":
        return LookupAnswer(lookupd, ())
    if status != 200:
        return _failure(lookupd, f"answered HTTP {status} {message or ''}".rstrip(), status)
    if not isinstance(document, dict):
        return _failure(lookupd, "answer is not a JSON object with producers", status)
    producers = document.get("producers")
    if producers is None:
        producers = []
    if not isinstance(producers, list):
        return _failure(lookupd, f"'producers' is not a list: {producers!r:.80}", status)
    found: dict[str, NSQDAddress] = {}
    skipped = 0
    for entry in producers:
        address = _producer_address(entry)
        if address is None:
            skipped += 1
        else:
            found.setdefault(str(address), address)
    return LookupAnswer(lookupd, tuple(found.values()), skipped)


def _producer_address(entry: object) -> NSQDAddress | None:
    if not isinstance(entry, dict):
        return None
    host = entry.get("broadcast_address", entry.get("address"))
    port = entry.get("tcp_port")
    if not isinstance(host, str) or not host or any(c in host for c in " /[]\r\n\t"):
        return None
    if isinstance(port, bool) or not isinstance(port, int) or not 1 <= port <= 65535:
        return None
    return NSQDAddress(host, port)


def _failure(lookupd: LookupdAddress, text: str, status: int | None = None) -> LookupFailure:
    return LookupFailure(lookupd, LookupdError(f"lookupd {lookupd}: {text}", status))


class LookupRequest:
    """One ``GET /lookup?topic=...`` exchange (:class:`~nsq_sansio.http_client.HTTPClient`)."""

    __slots__ = ("_done", "_http", "data", "lookupd")

    def __init__(
        self, lookupd: LookupdAddress, topic: str, *, user_agent: str = "nsq-sansio"
    ) -> None:
        validate_topic(topic)
        self.lookupd = lookupd
        self._http = HTTPClient(
            _join(lookupd.host, lookupd.port),
            max_body_size=MAX_RESPONSE_SIZE,
            user_agent=user_agent,
        )
        target = f"{lookupd.path_prefix}/lookup?topic={quote(topic, safe='')}"
        #: The request bytes for the transport to write.
        self.data: bytes = self._http.request("GET", target, headers=(("Connection", "close"),))
        self._done = False

    @property
    def done(self) -> bool:
        """True once the answer (or the failure) was returned: later bytes are ignored."""
        return self._done

    def receive_data(self, data: bytes) -> LookupAnswer | LookupFailure | None:
        """Feed bytes read (``b""`` at EOF); the outcome when complete, else None."""
        if self._done:
            return None
        try:
            answer = self._http.receive_data(data)
        except ConnectionLost:
            return self._finish(_failure(self.lookupd, "connection closed early"))
        except RemoteProtocolError as exc:  # broken, or over MAX_RESPONSE_SIZE
            return self._finish(_failure(self.lookupd, str(exc)))
        if answer is None:
            return None
        return self._finish(parse_lookup_response(self.lookupd, answer.status, answer.body))

    def receive_response(self, status: int, body: bytes) -> LookupAnswer | LookupFailure:
        """For transports with their own HTTP client: the status and body they read."""
        if len(body) > MAX_RESPONSE_SIZE:
            return self._finish(_failure(self.lookupd, f"answer over {MAX_RESPONSE_SIZE} bytes"))
        return self._finish(parse_lookup_response(self.lookupd, status, body))

    def _finish(self, outcome: LookupAnswer | LookupFailure) -> LookupAnswer | LookupFailure:
        self._done = True
        return outcome


class _LookupdSlot:
    __slots__ = ("address", "answer", "deadline", "next_poll", "request", "request_id")

    def __init__(self, address: LookupdAddress) -> None:
        self.address = address
        self.next_poll: float | None = None
        self.request: LookupRequest | None = None
        self.request_id = 0
        self.deadline = 0.0
        self.answer: frozenset[NSQDAddress] = frozenset()


class LookupdPoller:
    """Decides when to ask which lookupd, and keeps the union of what they answered."""

    def __init__(
        self,
        lookupds: Iterable[str | LookupdAddress],
        topic: str,
        *,
        interval: float,
        jitter: float,
        timeout: float,
        rng: random.Random,
        user_agent: str = "nsq-sansio",
    ) -> None:
        self._topic = validate_topic(topic)
        self._slots: dict[LookupdAddress, _LookupdSlot] = {}
        for text in lookupds:
            address = LookupdAddress.parse(text)
            self._slots.setdefault(address, _LookupdSlot(address))
        self._by_request: dict[int, _LookupdSlot] = {}
        self._interval = interval
        self._jitter = jitter
        self._timeout = timeout
        self._rng = rng
        self._user_agent = user_agent
        self._next_request_id = 1
        self._stopped = False

    @property
    def lookupds(self) -> Sequence[LookupdAddress]:
        """The nsqlookupd addresses polled, in the order given."""
        return tuple(self._slots)

    def known_nodes(self) -> frozenset[NSQDAddress]:
        """Union of the last good answer of every lookupd."""
        nodes: set[NSQDAddress] = set()
        for slot in self._slots.values():
            nodes |= slot.answer
        return frozenset(nodes)

    def start(self, now: float) -> list[PollRequest]:
        """Bootstrap: ask every lookupd at once."""
        for slot in self._slots.values():
            slot.next_poll = now
        return self.poll_due(now)[0]

    def stop(self) -> list[int]:
        """Stop polling; returns the ids of requests that were still waiting (to close)."""
        self._stopped = True
        pending = list(self._by_request)
        for slot in self._slots.values():
            slot.request = None
            slot.next_poll = None
        self._by_request.clear()
        return pending

    def poll_due(self, now: float) -> tuple[list[PollRequest], list[tuple[int, LookupFailure]]]:
        """Start the polls that are due and time out the requests that took too long."""
        requests: list[PollRequest] = []
        failures: list[tuple[int, LookupFailure]] = []
        if self._stopped:
            return requests, failures
        for slot in self._slots.values():
            if slot.request is not None and now >= slot.deadline:
                failures.append(
                    (slot.request_id, _failure(slot.address, f"no answer in {self._timeout:g}s"))
                )
                self._by_request.pop(slot.request_id, None)
                slot.request = None
            if slot.next_poll is not None and now >= slot.next_poll:
                slot.next_poll = now + self._interval * (1.0 + self._jitter * self._rng.random())
                if slot.request is not None:
                    continue  # still waiting for the previous answer: do not pile up
                request = LookupRequest(slot.address, self._topic, user_agent=self._user_agent)
                slot.request = request
                slot.request_id = self._next_request_id
                self._next_request_id += 1
                slot.deadline = now + self._timeout
                self._by_request[slot.request_id] = slot
                requests.append(PollRequest(slot.request_id, slot.address, request.data))
        return requests, failures

    def next_deadline(self) -> float | None:
        """The earliest due poll or request timeout."""
        best: float | None = None
        for slot in self._slots.values():
            for t in (slot.next_poll, slot.deadline if slot.request is not None else None):
                if t is not None and (best is None or t < best):
                    best = t
        return best

    def is_pending(self, request_id: int) -> bool:
        """Whether ``request_id`` is a poll of this poller still waiting for its answer."""
        return request_id in self._by_request

    def receive_data(self, request_id: int, data: bytes) -> LookupAnswer | LookupFailure | None:
        """Raw bytes of the answer to ``request_id``; the outcome once complete."""
        slot = self._by_request.get(request_id)
        if slot is None or slot.request is None:
            return None
        return self._settle(slot, request_id, slot.request.receive_data(data))

    def receive_response(
        self, request_id: int, status: int, body: bytes
    ) -> LookupAnswer | LookupFailure | None:
        """The already parsed status and body of the answer to ``request_id``."""
        slot = self._by_request.get(request_id)
        if slot is None or slot.request is None:
            return None
        return self._settle(slot, request_id, slot.request.receive_response(status, body))

    def fail(self, request_id: int, error: BaseException | str) -> LookupFailure | None:
        """The transport could not connect, write or read."""
        slot = self._by_request.get(request_id)
        if slot is None:
            return None
        failure = _failure(slot.address, f"request failed: {error}")
        self._settle(slot, request_id, failure)
        return failure

    def _settle(
        self, slot: _LookupdSlot, request_id: int, outcome: LookupAnswer | LookupFailure | None
    ) -> LookupAnswer | LookupFailure | None:
        if outcome is None:
            return None
        del self._by_request[request_id]
        slot.request = None
        if isinstance(outcome, LookupAnswer):
            slot.answer = frozenset(outcome.producers)
        return outcome
