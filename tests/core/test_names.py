"""Topic and channel names: nsqd's rule (1..64 of [.a-zA-Z0-9_-], optional #ephemeral)."""

from __future__ import annotations

import re

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from nsq_sansio.errors import InvalidName, LocalProtocolError
from nsq_sansio.names import is_ephemeral, validate_channel, validate_topic

ALLOWED = "._-abcxyzABCXYZ0189"

# nsqd's protocol.IsValidTopicName: len(name) in 1..64 and ^[.a-zA-Z0-9_-]+(#ephemeral)?$
_NSQD = re.compile(r"[.a-zA-Z0-9_-]+(#ephemeral)?")


def nsqd_accepts(name: str) -> bool:
    return 1 <= len(name) <= 64 and _NSQD.fullmatch(name) is not None


@pytest.mark.parametrize(
    "name",
    ["a", "x" * 64, ".", "-", "_", "Topic.Name-1_2", "a#ephemeral", "x" * 54 + "#ephemeral"],
)
def test_valid_names(name: str) -> None:
    assert validate_topic(name) == name
    assert validate_channel(name) == name


@pytest.mark.parametrize(
    "name",
    [
        "",
        "x" * 65,
        "x" * 55 + "#ephemeral",  # 65 in total: nsqd counts the suffix
        "#ephemeral",
        "a#eph",
        "a#ephemeral#ephemeral",
        "a#Ephemeral",
        "a b",
        "a\n",  # `$` would accept this; names end the command line
        "a\x00",
        "tópico",
        "a/b",
        "a:b",
        "\uff41",  # full-width letter a: not ASCII
    ],
)
def test_invalid_names(name: str) -> None:
    with pytest.raises(InvalidName, match="topic"):
        validate_topic(name)
    with pytest.raises(InvalidName, match="channel"):
        validate_channel(name)


def test_invalid_name_error_is_clear_and_typed() -> None:
    with pytest.raises(InvalidName) as info:
        validate_topic("bad name")
    assert "'bad name'" in str(info.value) and "64" in str(info.value)
    assert isinstance(info.value, LocalProtocolError) and isinstance(info.value, ValueError)
    with pytest.raises(InvalidName, match="str"):
        validate_topic(b"bytes")  # type: ignore[arg-type]
    with pytest.raises(InvalidName):
        validate_channel(None)  # type: ignore[arg-type]


def test_is_ephemeral() -> None:
    assert is_ephemeral("a#ephemeral")
    assert not is_ephemeral("ephemeral")


@settings(max_examples=300, deadline=None)
@given(
    st.one_of(
        st.text(alphabet=ALLOWED + "#ephmrl ", max_size=80),
        st.text(max_size=70),
        st.from_regex(r"[.a-zA-Z0-9_-]{1,64}(#ephemeral)?", fullmatch=True),
    )
)
def test_validation_matches_nsqd_rule(name: str) -> None:
    if nsqd_accepts(name):
        assert validate_topic(name) == name
    else:
        with pytest.raises(InvalidName):
            validate_topic(name)
