"""Checks of user arguments, made where the user called: bad input must raise there, with a
clear library error, and never reach the tasks or the IO thread that own the connections."""

from __future__ import annotations

import math

from nsq_sansio.errors import LocalProtocolError, NSQError

__all__ = ["check_seconds"]


def check_seconds(
    what: str,
    value: object,
    *,
    zero: bool = True,
    error: type[NSQError] = LocalProtocolError,
) -> None:
    """Raise ``error`` unless ``value`` is a finite number of seconds ``>= 0`` (``> 0`` when
    ``zero`` is False); bools, strings, inf and nan are refused."""
    if (
        isinstance(value, bool)
        or not isinstance(value, int | float)
        or not math.isfinite(value)
        or value < 0
        or (value == 0 and not zero)
    ):
        bound = ">= 0" if zero else "> 0"
        raise error(f"{what} must be a finite number of seconds {bound}, got {value!r}")
