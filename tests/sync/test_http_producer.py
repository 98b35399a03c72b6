"""The blocking HTTPProducer's second defence against sending a request twice: a pooled
connection whose write fails before any byte of the request went out was provably not read by
nsqd, so the request goes on a fresh connection (the pool's check before use cannot see a
reset that arrives just after it)."""

from __future__ import annotations

import pytest
from support.scripted_http import scripted

import transports.sync.http
from transports.sync import HTTPProducer


def test_a_write_failing_before_any_byte_goes_on_a_fresh_connection(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    with scripted(lambda n: "ok-then-reset" if n == 1 else "ok") as server:
        with HTTPProducer(server.url, timeout=5.0) as http:
            http.publish("t", b"first")
            assert server.closed.wait(5)  # the server reset the kept-alive connection
            # as if the reset came in just after the check of the pooled connection
            monkeypatch.setattr(transports.sync.http, "idle_socket_closed", lambda fileno: False)
            http.publish("t", b"second")
        assert server.requests == 2
