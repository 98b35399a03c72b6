"""Config: go-nsq defaults, validation errors that name the field and range, IDENTIFY body."""

from __future__ import annotations

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from nsq_sansio.config import Config
from nsq_sansio.errors import ConfigError


def test_defaults_follow_go_nsq() -> None:
    c = Config()
    assert c.max_in_flight == 1
    assert c.max_attempts == 5
    assert c.default_requeue_delay == 90.0
    assert c.max_requeue_delay == 900.0
    assert c.backoff_multiplier == 1.0
    assert c.max_backoff_duration == 120.0
    assert c.lookupd_poll_interval == 60.0
    assert c.lookupd_poll_jitter == 0.3
    assert c.low_rdy_idle_timeout == 10.0
    assert c.rdy_redistribute_interval == 5.0
    assert c.max_waiting_fetches == 512
    assert c.backoff_active


@pytest.mark.parametrize(
    ("field", "value", "fragment"),
    [
        ("max_in_flight", -1, "0 <= max_in_flight <= 2147483647"),
        ("max_in_flight", 1.5, "must be an integer"),
        ("max_in_flight", True, "must be an integer"),
        ("max_attempts", 70000, "0 <= max_attempts <= 65535"),
        ("lookupd_poll_jitter", 1.5, "0 <= lookupd_poll_jitter <= 1"),
        ("lookupd_poll_interval", 0.0, "lookupd_poll_interval"),
        ("low_rdy_idle_timeout", 0.5, "1 <= low_rdy_idle_timeout <= 300"),
        ("rdy_redistribute_interval", 10.0, "rdy_redistribute_interval <= 5"),
        ("deflate_level", 0, "1 <= deflate_level <= 9"),
        ("sample_rate", 100, "0 <= sample_rate <= 99"),
        ("heartbeat_interval", 0.5, "heartbeat_interval"),
        ("msg_timeout", 0.1, "msg_timeout"),
        ("output_buffer_size", 10, "output_buffer_size"),
        ("default_requeue_delay", math.nan, "default_requeue_delay"),
        ("max_backoff_duration", math.inf, "max_backoff_duration"),
        ("backoff_enabled", 1, "True or False"),
        ("max_waiting_fetches", 0, "max_waiting_fetches"),
        ("auth_secret", "text", "auth_secret"),
    ],
)
def test_bad_value_names_field_and_range(field: str, value: object, fragment: str) -> None:
    with pytest.raises(ConfigError) as info:
        Config(**{field: value})  # type: ignore[arg-type]
    assert field in str(info.value)
    assert fragment in str(info.value)
    assert isinstance(info.value, ValueError)


def test_exclusive_compression_and_reconnect_order() -> None:
    with pytest.raises(ConfigError, match="snappy"):
        Config(snappy=True, deflate=True)
    with pytest.raises(ConfigError, match="max_reconnect_delay"):
        Config(reconnect_delay=10.0, max_reconnect_delay=5.0)


def test_replace_validates_and_rejects_unknown_fields() -> None:
    c = Config().replace(max_in_flight=10)
    assert c.max_in_flight == 10
    with pytest.raises(ConfigError):
        c.replace(max_in_flight=-5)
    with pytest.raises(ConfigError, match="unknown"):
        c.replace(no_such_field=1)


def test_frozen() -> None:
    with pytest.raises(AttributeError):
        Config().max_in_flight = 3  # type: ignore[misc]


def test_identify_body_converts_to_milliseconds() -> None:
    body = Config(
        client_id="c",
        hostname="h.example",
        heartbeat_interval=5.0,
        msg_timeout=120.0,
        output_buffer_timeout=0.1,
        deflate=True,
        deflate_level=3,
        sample_rate=10,
    ).identify_body()
    assert body["heartbeat_interval"] == 5000
    assert body["msg_timeout"] == 120000
    assert body["output_buffer_timeout"] == 100
    assert body["output_buffer_size"] == 16384
    assert body["deflate"] is True and body["deflate_level"] == 3
    assert body["client_id"] == "c" and body["hostname"] == "h.example"
    assert body["feature_negotiation"] is True
    assert body["sample_rate"] == 10


def test_identify_body_disabled_and_unset_fields() -> None:
    body = Config(
        heartbeat_interval=None, output_buffer_size=-1, output_buffer_timeout=-1, msg_timeout=None
    ).identify_body()
    assert body["heartbeat_interval"] == -1
    assert body["output_buffer_size"] == -1
    assert body["output_buffer_timeout"] == -1
    assert "msg_timeout" not in body and "client_id" not in body
    body2 = Config(output_buffer_size=None, output_buffer_timeout=None).identify_body()
    assert "output_buffer_size" not in body2 and "output_buffer_timeout" not in body2


@settings(max_examples=200, deadline=None)
@given(st.integers(min_value=-(2**40), max_value=2**40))
def test_max_in_flight_is_accepted_iff_in_range(n: int) -> None:
    if 0 <= n <= 2**31 - 1:
        assert Config(max_in_flight=n).max_in_flight == n
    else:
        with pytest.raises(ConfigError):
            Config(max_in_flight=n)
