"""transports/_common: the pieces every transport shares (no sockets here)."""

from __future__ import annotations

import logging
import socket
import ssl

import pytest

from nsq_sansio.config import Config
from nsq_sansio.errors import ConfigError, ConnectionLost, RemoteProtocolError
from transports._common import (
    TOPICS_REMEMBERED,
    ConnectionLogger,
    HTTPPublishClient,
    HTTPPublishError,
    TLSOptions,
    build_ssl_context,
    format_address,
    make_config,
    parse_address,
    parse_http_url,
    remember_topic,
    split_options,
)
from transports._common.http_publish import MAX_ANSWER_SIZE, idle_socket_closed
from transports._common.options import host_names


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("127.0.0.1:4150", ("127.0.0.1", 4150)),
        ("nsqd.internal", ("nsqd.internal", 4150)),
        ("[::1]:4151", ("::1", 4151)),
        ("::1", ("::1", 4150)),
        ("http://10.0.0.1:4161", ("10.0.0.1", 4161)),
    ],
)
def test_parse_address(text: str, expected: tuple[str, int]) -> None:
    assert parse_address(text) == expected
    assert parse_address(format_address(*expected)) == expected


@pytest.mark.parametrize("bad", ["", ":4150", "host:0", "host:99999", "host:abc", "[::1]x"])
def test_parse_address_rejects(bad: str) -> None:
    with pytest.raises(ValueError):
        parse_address(bad)


def test_parse_http_url() -> None:
    url = parse_http_url("https://lookupd:8443/prefix/")
    assert (url.scheme, url.host, url.port, url.path) == ("https", "lookupd", 8443, "/prefix")
    assert parse_http_url("127.0.0.1").port == 4161
    assert url.target("/lookup", {"topic": "a b"}) == "/prefix/lookup?topic=a%20b"
    with pytest.raises(ValueError):
        parse_http_url("ftp://x")


def test_ssl_context_verifies_by_default() -> None:
    context = build_ssl_context()
    assert context.verify_mode is ssl.CERT_REQUIRED and context.check_hostname
    assert context.minimum_version >= ssl.TLSVersion.TLSv1_2
    loose = build_ssl_context(verify=False)
    assert loose.verify_mode is ssl.CERT_NONE and not loose.check_hostname
    assert TLSOptions(server_name="nsqd.internal").server_hostname("10.0.0.1") == "nsqd.internal"
    assert TLSOptions().server_hostname("10.0.0.1") == "10.0.0.1"


def test_split_options_maps_config_and_transport_keywords() -> None:
    config, options = split_options(None, {"max_in_flight": 7, "tls_verify": False})
    assert config.max_in_flight == 7 and config.tls_v1  # a TLS option turns TLS on
    assert options.tls.verify is False
    config, options = split_options(Config(max_attempts=2), {"connect_timeout": 1.5})
    assert config.max_attempts == 2 and options.connect_timeout == 1.5 and not config.tls_v1
    assert config.connect_timeout == 1.5
    # One dial timeout on every runtime: the config's (the anyio side used to default to 5 s,
    # the blocking side to the config's 10 s).
    config, options = split_options(Config(connect_timeout=3.0), {})
    assert options.connect_timeout == config.connect_timeout == 3.0
    assert split_options(None, {})[1].connect_timeout == Config().connect_timeout
    with pytest.raises(ConfigError, match="unknown option"):
        split_options(None, {"max_in_fligth": 1})
    with pytest.raises(ConfigError):
        split_options(None, {"max_in_flight": -1})
    assert make_config(auth_secret="s").auth_secret == b"s"


def test_http_publish_client_keep_alive_and_errors() -> None:
    client = HTTPPublishClient("127.0.0.1:4151")
    request = client.pub("events", b"hello", defer=1.5)
    assert request.startswith(b"POST /pub?topic=events&defer=1500 HTTP/1.1\r\n")
    assert request.endswith(b"\r\n\r\nhello")
    assert client.receive_data(b"HTTP/1.1 200 OK\r\nContent-Le") is None
    response = client.receive_data(b"ngth: 2\r\n\r\nOK")
    assert response is not None and response.ok and response.keep_alive
    # the same client sends the next request (keep-alive)
    request = client.mpub("events", [b"a\n", b"bc"])
    assert b"/mpub?topic=events&binary=true" in request
    assert request.endswith(b"\x00\x00\x00\x02\x00\x00\x00\x02a\n\x00\x00\x00\x02bc")
    body = b'{"message":"INVALID_TOPIC"}'
    response = client.receive_data(
        b"HTTP/1.1 400 Bad Request\r\nContent-Length: %d\r\n\r\n%s" % (len(body), body)
    )
    assert response is not None and not response.ok
    with pytest.raises(HTTPPublishError, match="INVALID_TOPIC") as info:
        response.raise_for_status()
    assert info.value.status == 400
    client.pub("events", b"x")
    with pytest.raises(ConnectionLost):
        client.receive_data(b"")


def test_identify_names_default_to_the_host_names(monkeypatch: pytest.MonkeyPatch) -> None:
    """client_id is the short host name and hostname the full one (as go-nsq sends them),
    read once per process; what the user sets wins, "" included."""
    monkeypatch.setattr(socket, "gethostname", lambda: "web-3.dc1.example.org")
    host_names.cache_clear()
    try:
        config, _ = split_options(None, {})
        assert (config.client_id, config.hostname) == ("web-3", "web-3.dc1.example.org")
        body = config.identify_body()
        assert (body["client_id"], body["hostname"]) == ("web-3", "web-3.dc1.example.org")
        config, _ = split_options(Config(client_id="billing"), {"hostname": ""})
        assert (config.client_id, config.hostname) == ("billing", "")
        monkeypatch.setattr(socket, "gethostname", lambda: "changed")
        assert split_options(None, {})[0].client_id == "web-3"  # read once
    finally:
        host_names.cache_clear()


def test_http_publish_answers_are_bounded() -> None:
    """A publish answer is read up to MAX_ANSWER_SIZE: an announced length over it is refused
    before any body arrives, a chunked body as soon as it passes it."""
    client = HTTPPublishClient("127.0.0.1:4151")
    client.pub("events", b"x")
    with pytest.raises(RemoteProtocolError, match="announces"):
        client.receive_data(b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n" % (10**9))
    client = HTTPPublishClient("127.0.0.1:4151")
    client.pub("events", b"x")
    assert client.receive_data(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n") is None
    chunk = b"8000\r\n" + b"x" * 0x8000 + b"\r\n"
    assert client.receive_data(chunk * (MAX_ANSWER_SIZE // 0x8000)) is None
    with pytest.raises(RemoteProtocolError, match=f"over {MAX_ANSWER_SIZE} bytes"):
        client.receive_data(chunk)


def test_idle_socket_closed_sees_a_close_or_stray_bytes_without_reading() -> None:
    ours, theirs = socket.socketpair()
    with ours, theirs:
        assert not idle_socket_closed(ours.fileno())
        theirs.sendall(b"x")
        assert idle_socket_closed(ours.fileno())
        assert idle_socket_closed(ours.fileno())  # nothing was read
        assert ours.recv(1) == b"x"
        assert not idle_socket_closed(ours.fileno())
        theirs.close()
        assert idle_socket_closed(ours.fileno())
    assert idle_socket_closed(-1)


def test_connection_logger_puts_the_address_in_each_record(
    caplog: pytest.LogCaptureFixture,
) -> None:
    log = ConnectionLogger(logging.getLogger("nsq_sansio.test"), "127.0.0.1:4150")
    with caplog.at_level(logging.INFO, logger="nsq_sansio.test"):
        log.info("hello %d", 1)
        log.with_address("10.0.0.2:4150").warning("other")
    first, second = caplog.records
    assert first.getMessage() == "[127.0.0.1:4150] hello 1"
    assert getattr(first, "nsq_address", None) == "127.0.0.1:4150"
    assert getattr(second, "nsq_address", None) == "10.0.0.2:4150"


def test_remember_topic_starts_again_when_full() -> None:
    checked: set[str] = set()
    for i in range(TOPICS_REMEMBERED):
        remember_topic(checked, f"t{i}")
    assert len(checked) == TOPICS_REMEMBERED
    remember_topic(checked, "one more")
    assert checked == {"one more"}
