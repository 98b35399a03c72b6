"""A secret given to the core never shows: not in a config's repr or str, not in any event or
error a connection holding it produces, whatever the server answers."""

from __future__ import annotations

import pytest

from nsq_sansio import ClientConnection, ConnectionState, Event
from nsq_sansio.config import Config
from nsq_sansio.errors import ConfigError

from ._helpers import HEARTBEAT, OK, error, identify_answer, response

SECRET = b"planted-S3CRET-value"


def assert_hidden(*things: object) -> None:
    for thing in things:
        for text in (repr(thing), str(thing)):
            assert SECRET.decode() not in text, text
            assert repr(SECRET) not in text, text


def test_config_repr_and_str_show_no_secret() -> None:
    config = Config(auth_secret=SECRET, client_id="worker")
    assert "auth_secret='***'" in repr(config) and "client_id='worker'" in repr(config)
    assert_hidden(config, config.replace(max_in_flight=5), [config], {"c": config})
    assert "auth_secret=None" in repr(Config())  # no secret: nothing to hide


def test_config_errors_show_no_secret() -> None:
    config = Config(auth_secret=SECRET)
    for bad in ({"max_in_flight": -1}, {"auth_secret": SECRET.decode()}, {"nope": SECRET}):
        with pytest.raises(ConfigError) as caught:
            config.replace(**bad)
        assert_hidden(caught.value)


def authenticating(**kwargs: object) -> tuple[ClientConnection, list[Event]]:
    conn = ClientConnection(auth_secret=SECRET, **kwargs)  # type: ignore[arg-type]
    events = list(conn.receive_data(identify_answer(auth_required=True), now=0.0))
    return conn, events


AUTH_ANSWERS = {
    "accepted": response(b'{"identity":"me","identity_url":"","permission_count":1}'),
    "auth failed": error(b"E_AUTH_FAILED AUTH failed"),
    "unauthorized": error(b"E_UNAUTHORIZED AUTH no permissions"),
    "bad json": response(b"{not json"),
    "not an object": response(b"[1, 2]"),
    "too large": response(b"[" * 70_000),
    "heartbeat then eof": HEARTBEAT + b"\x00\x00",
    "garbage": b"\xff" * 12,
}


@pytest.mark.parametrize("answer", sorted(AUTH_ANSWERS))
def test_no_event_or_error_of_an_authenticating_connection_shows_the_secret(answer: str) -> None:
    conn, events = authenticating()
    assert conn.state is ConnectionState.AUTHENTICATING
    sent = conn.data_to_send()
    assert SECRET in sent  # it is sent, as AUTH's body, and only there
    events += conn.receive_data(AUTH_ANSWERS[answer], now=1.0)
    events += conn.receive_data(b"", now=2.0)
    closed = conn.close()
    assert_hidden(conn, *events, closed)
    for event in events:
        assert_hidden(*(getattr(event, name, None) for name in ("error", "auth", "settings")))


def test_refusing_plaintext_auth_shows_no_secret() -> None:
    conn, events = authenticating(auth_requires_tls=True)
    assert conn.state is ConnectionState.CLOSED and conn.data_to_send() == b""
    assert_hidden(conn, *events, *(getattr(e, "error", None) for e in events))


def test_a_connection_from_config_shows_no_secret() -> None:
    conn = ClientConnection.from_config(Config(auth_secret=SECRET))
    events = conn.receive_data(OK, now=0.0)  # an old nsqd: no AUTH asked
    assert_hidden(conn, *events, conn.settings)
