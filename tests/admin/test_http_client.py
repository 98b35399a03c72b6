"""The sans-IO HTTP client connection: request bytes, answers in any chunking, keep-alive,
and every bound (header size, announced and streamed body size) enforced before the bytes
are kept; broken answers are RemoteProtocolError, cut answers ConnectionLost."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from nsq_sansio.errors import ConfigError, ConnectionLost, LocalProtocolError, RemoteProtocolError
from nsq_sansio.http_client import HTTPAnswer, HTTPClient

OK = b'HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 13\r\n\r\n{"topics":[]}'


def feed(client: HTTPClient, *chunks: bytes) -> HTTPAnswer | None:
    answer = None
    for chunk in chunks:
        answer = client.receive_data(chunk)
    return answer


def test_request_bytes() -> None:
    client = HTTPClient("127.0.0.1:4151", user_agent="ua/1")
    data = client.request("POST", "/topic/create?topic=t")
    head = data.decode()
    assert head.startswith("POST /topic/create?topic=t HTTP/1.1\r\n")
    for header in ("Host: 127.0.0.1:4151", "User-Agent: ua/1", "Content-Length: 0"):
        assert header.lower() in head.lower()
    assert head.endswith("\r\n\r\n")
    with pytest.raises(LocalProtocolError):
        client.request("GET", "/ping")  # the first one is not answered yet


@settings(max_examples=100, deadline=None)
@given(cuts=st.lists(st.integers(min_value=0, max_value=len(OK)), max_size=8))
def test_answer_in_any_chunking(cuts: list[int]) -> None:
    client = HTTPClient("h:1")
    client.request("GET", "/topics")
    points = sorted(set(cuts))
    chunks = [OK[a:b] for a, b in zip([0, *points], [*points, len(OK)], strict=True) if b > a]
    answers = [client.receive_data(chunk) for chunk in chunks]
    assert all(a is None for a in answers[:-1])
    assert answers[-1] == HTTPAnswer(200, b'{"topics":[]}')
    assert answers[-1].keep_alive and answers[-1].ok


def test_keep_alive_carries_the_next_request_and_close_ends_it() -> None:
    client = HTTPClient("h:1")
    for _ in range(3):
        client.request("GET", "/topics")
        answer = feed(client, OK)
        assert answer is not None and answer.keep_alive and client.idle
    client.request("GET", "/topics")
    answer = feed(client, b"HTTP/1.1 200 OK\r\nConnection: close\r\nContent-Length: 2\r\n\r\nOK")
    assert answer is not None and not answer.keep_alive and answer.body == b"OK"
    with pytest.raises(LocalProtocolError):
        client.request("GET", "/topics")


def test_informational_answers_are_skipped() -> None:
    client = HTTPClient("h:1")
    client.request("GET", "/ping")
    assert feed(client, b"HTTP/1.1 100 Continue\r\n\r\n", OK) == HTTPAnswer(200, b'{"topics":[]}')


def test_announced_body_over_the_limit_fails_before_the_body() -> None:
    client = HTTPClient("h:1", max_body_size=1000)
    client.request("GET", "/stats")
    with pytest.raises(RemoteProtocolError, match="announces 1001 bytes"):
        client.receive_data(b"HTTP/1.1 200 OK\r\nContent-Length: 1001\r\n\r\n")
    exact = HTTPClient("h:1", max_body_size=4)
    exact.request("GET", "/stats")
    assert feed(exact, b"HTTP/1.1 200 OK\r\nContent-Length: 4\r\n\r\nabcd") == HTTPAnswer(
        200, b"abcd"
    )


def test_streamed_body_over_the_limit_fails_as_it_arrives() -> None:
    chunk = b"400\r\n" + b"x" * 0x400 + b"\r\n"
    client = HTTPClient("h:1", max_body_size=4096)
    client.request("GET", "/stats")
    client.receive_data(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n")
    for _ in range(4):
        assert client.receive_data(chunk) is None
    with pytest.raises(RemoteProtocolError, match="over 4096 bytes"):
        client.receive_data(chunk)
    # an HTTP/1.0 answer delimited by the close of the connection
    old = HTTPClient("h:1", max_body_size=10)
    old.request("GET", "/stats")
    old.receive_data(b"HTTP/1.0 200 OK\r\n\r\n0123456789")
    with pytest.raises(RemoteProtocolError):
        old.receive_data(b"!")


def test_headers_over_the_limit() -> None:
    client = HTTPClient("h:1", max_header_size=1024)
    client.request("GET", "/stats")
    with pytest.raises(RemoteProtocolError):
        client.receive_data(b"HTTP/1.1 200 OK\r\nX-Junk: " + b"j" * 2048)


def test_eof_before_and_during_the_answer() -> None:
    client = HTTPClient("h:1")
    client.request("GET", "/ping")
    with pytest.raises(ConnectionLost):
        client.receive_data(b"")
    assert not client.answer_started  # nothing came: the server likely never saw the request
    cut = HTTPClient("h:1")
    cut.request("GET", "/ping")
    cut.receive_data(OK[:-3])
    with pytest.raises(ConnectionLost):
        cut.receive_data(b"")
    assert cut.answer_started


def test_garbage_is_a_remote_protocol_error() -> None:
    client = HTTPClient("h:1")
    client.request("GET", "/ping")
    with pytest.raises(RemoteProtocolError):
        client.receive_data(b"SSH-2.0-OpenSSH_9.6\r\n\r\n")


@settings(max_examples=300, deadline=None)
@given(chunks=st.lists(st.binary(max_size=40) | st.sampled_from([OK[:30], OK]), max_size=6))
def test_any_bytes_give_an_answer_or_a_typed_error(chunks: list[bytes]) -> None:
    client = HTTPClient("h:1", max_body_size=64, max_header_size=256)
    client.request("GET", "/stats")
    try:
        for chunk in [*chunks, b""]:
            answer = client.receive_data(chunk)
            if answer is not None:
                assert len(answer.body) <= 64
                break
    except (RemoteProtocolError, ConnectionLost):
        pass


def test_bytes_after_the_answer_end_the_connection() -> None:
    """A server that sent more than the answer (a second answer, junk): the connection is not
    reused, so those bytes are never read as the answer to the next request."""
    client = HTTPClient("h:1")
    client.request("GET", "/ping")
    answer = client.receive_data(OK + OK)
    assert answer is not None and answer.body == b'{"topics":[]}' and not answer.keep_alive


@pytest.mark.parametrize(
    ("sizes", "field"),
    [({"max_body_size": -1}, "max_body_size"), ({"max_header_size": 0}, "max_header_size")],
)
def test_bad_size_limits_are_a_config_error_naming_the_field(
    sizes: dict[str, int], field: str
) -> None:
    with pytest.raises(ConfigError, match=field):
        HTTPClient("nsqd:4151", **sizes)
