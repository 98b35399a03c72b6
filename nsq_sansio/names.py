"""Topic and channel name rules: 1 to 64 of ``[.a-zA-Z0-9_-]``, optionally ending ``#ephemeral``."""

from __future__ import annotations

import re

from .errors import InvalidName

__all__ = [
    "EPHEMERAL_SUFFIX",
    "MAX_NAME_LENGTH",
    "is_ephemeral",
    "validate_channel",
    "validate_topic",
]

MAX_NAME_LENGTH = 64
EPHEMERAL_SUFFIX = "#ephemeral"
_NAME = re.compile(r"[.a-zA-Z0-9_-]{1,64}(#ephemeral)?\Z")


def _validate(kind: str, name: object) -> str:
    if not isinstance(name, str):
        raise InvalidName(f"{kind} name must be a str, not {type(name).__name__}")
    if len(name) > MAX_NAME_LENGTH or not _NAME.match(name):
        raise InvalidName(
            f"invalid {kind} name {name!r}: use 1 to {MAX_NAME_LENGTH} characters of "
            f"[.a-zA-Z0-9_-], optionally followed by {EPHEMERAL_SUFFIX!r}"
        )
    return name


def validate_topic(name: str) -> str:
    """Return ``name`` if it is a valid topic name, else raise :class:`InvalidName`."""
    return _validate("topic", name)


def validate_channel(name: str) -> str:
    """Return ``name`` if it is a valid channel name, else raise :class:`InvalidName`."""
    return _validate("channel", name)


def is_ephemeral(name: str) -> bool:
    """Ephemeral topics and channels are never written to disk and vanish with their last client."""
    return name.endswith(EPHEMERAL_SUFFIX)
