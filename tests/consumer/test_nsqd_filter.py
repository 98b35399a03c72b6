"""What a lookupd can make a consumer connect to: ``nsqd_filter`` and :func:`allow_nsqd`.

A lookupd answer is untrusted input: it may list any host and port (an nsqd that registered
itself with a made-up broadcast address, a lookupd that is not ours). The coordinator connects
only to the addresses the filter accepts, reports each refused one once, and never filters the
addresses the user gave directly.
"""

from __future__ import annotations

import json
import random

import pytest

from nsq_sansio.config import Config
from nsq_sansio.consumer import Connect, ConsumerCoordinator, NodeRefused, SendHTTPRequest
from nsq_sansio.discovery import NSQDAddress, allow_nsqd
from nsq_sansio.errors import ConfigError


def producers(*addresses: str) -> bytes:
    entries = []
    for text in addresses:
        address = NSQDAddress.parse(text)
        entries.append({"broadcast_address": address.host, "tcp_port": address.port})
    return json.dumps({"channels": [], "producers": entries}).encode()


def polled(
    nsqd_filter: object, answer: bytes, *, nsqd: tuple[str, ...] = ()
) -> tuple[ConsumerCoordinator, list[object]]:
    """A coordinator polling one lookupd that answers ``answer``; its actions."""
    coordinator = ConsumerCoordinator(
        "t",
        "c",
        Config(),
        rng=random.Random(0),
        nsqd=nsqd,
        lookupd=["http://lookupd.internal:4161"],
        nsqd_filter=nsqd_filter,  # type: ignore[arg-type]
    )
    coordinator.start(0.0)
    actions = list(coordinator.take_actions())
    (request,) = [a for a in actions if isinstance(a, SendHTTPRequest)]
    coordinator.http_response(request.request_id, 200, answer, 0.0)
    return coordinator, actions + coordinator.take_actions()


def connected(actions: list[object]) -> list[str]:
    return [str(a.address) for a in actions if isinstance(a, Connect)]


def test_only_the_addresses_the_filter_accepts_are_connected() -> None:
    answer = producers("10.0.0.7:4150", "203.0.113.9:4150", "nsqd-1.internal:4150")
    _, actions = polled(allow_nsqd("10.0.0.0/8", "nsqd-1.internal"), answer)
    assert connected(actions) == ["10.0.0.7:4150", "nsqd-1.internal:4150"]
    refused = [a for a in actions if isinstance(a, NodeRefused)]
    assert [str(a.address) for a in refused] == ["203.0.113.9:4150"]
    assert str(refused[0].lookupd) == "http://lookupd.internal:4161"


def test_a_refused_address_is_reported_once_and_never_connected() -> None:
    answer = producers("203.0.113.9:4150")
    coordinator, actions = polled(allow_nsqd("10.0.0.0/8"), answer)
    assert len([a for a in actions if isinstance(a, NodeRefused)]) == 1
    for poll in range(1, 4):  # later polls list it again
        now = poll * 100.0
        coordinator.handle_timer(now)
        later = coordinator.take_actions()
        (request,) = [a for a in later if isinstance(a, SendHTTPRequest)]
        coordinator.http_response(request.request_id, 200, answer, now)
        later += coordinator.take_actions()
        assert not connected(later)
        assert not [a for a in later if isinstance(a, NodeRefused)]


def test_without_a_filter_every_listed_address_is_connected() -> None:
    answer = producers("10.0.0.7:4150", "203.0.113.9:4150")
    _, actions = polled(None, answer)
    assert connected(actions) == ["10.0.0.7:4150", "203.0.113.9:4150"]


def test_direct_addresses_are_not_filtered() -> None:
    _, actions = polled(allow_nsqd("10.0.0.0/8"), producers(), nsqd=("203.0.113.9:4150",))
    assert connected(actions) == ["203.0.113.9:4150"]


def test_any_callable_is_a_filter_and_anything_else_is_refused() -> None:
    answer = producers("10.0.0.7:4150", "10.0.0.8:4151")
    _, actions = polled(lambda address: address.port == 4151, answer)
    assert connected(actions) == ["10.0.0.8:4151"]
    with pytest.raises(ConfigError, match="nsqd_filter must be callable"):
        polled(["10.0.0.0/8"], answer)


@pytest.mark.parametrize(
    ("entries", "address", "accepted"),
    [
        (("10.0.0.0/8",), "10.1.2.3:4150", True),
        (("10.0.0.0/8",), "11.1.2.3:4150", False),
        (("10.0.0.0/8",), "ten.internal:4150", False),  # a name is never resolved
        (("fd00::/8",), "[fd12::1]:4150", True),
        (("fd00::/8",), "[fe80::1]:4150", False),
        (("::1",), "[0:0::1]:4150", True),  # the same address, written otherwise
        (("[::1]:4150",), "[::1]:4151", False),
        (("10.0.0.7",), "10.0.0.7:9999", True),  # no port given: any port
        (("10.0.0.7:4150",), "10.0.0.7:4150", True),
        (("10.0.0.7:4150",), "10.0.0.7:4151", False),
        (("NSQD-1.Internal",), "nsqd-1.internal.:4150", True),  # case and root dot aside
        (("nsqd-1.internal",), "nsqd-1.internal.evil.example:4150", False),
        (("nsqd-1.internal:4150",), "nsqd-1.internal:4150", True),
        (("nsqd-1.internal:4150",), "nsqd-1.internal:4151", False),
    ],
)
def test_allow_nsqd_matches(entries: tuple[str, ...], address: str, accepted: bool) -> None:
    assert allow_nsqd(*entries)(NSQDAddress.parse(address)) is accepted


@pytest.mark.parametrize("entry", ["", "10.0.0.0/33", "host:port", "a b", "[::1", 4150, None])
def test_allow_nsqd_refuses_a_bad_entry(entry: object) -> None:
    with pytest.raises(ConfigError, match="allow_nsqd"):
        allow_nsqd(entry)  # type: ignore[arg-type]


def test_allow_nsqd_needs_an_entry_and_shows_them() -> None:
    with pytest.raises(ConfigError, match="at least one"):
        allow_nsqd()
    assert repr(allow_nsqd("10.0.0.0/8", "[::1]:4150")) == "allow_nsqd('10.0.0.0/8', '[::1]:4150')"
