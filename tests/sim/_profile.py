"""Hypothesis settings for the simulation suite.

CI runs a bounded, derandomized number of examples (the whole sim suite stays well under 90 s);
``NSQ_SIM_PROFILE=nightly`` raises the count and lets hypothesis search freely, and
``NSQ_SIM_PROFILE=long`` also runs the ``slow`` long search (``test_soak.py``)::

    NSQ_SIM_PROFILE=nightly python -m pytest tests/sim
    NSQ_SIM_PROFILE=long NSQ_SIM_SOAK_MINUTES=240 python -m pytest tests/sim -m slow -s
"""

from __future__ import annotations

import os

from hypothesis import HealthCheck, settings

PROFILE = os.environ.get("NSQ_SIM_PROFILE", "ci").strip().lower()
NIGHTLY = PROFILE in ("nightly", "long")
LONG = PROFILE == "long"

_HEALTH = [HealthCheck.too_slow, HealthCheck.data_too_large]
_EXAMPLES = os.environ.get("NSQ_SIM_EXAMPLES")

#: Settings for whole-cluster property tests.
SIM = (
    settings(
        max_examples=int(_EXAMPLES or "1000"),
        deadline=None,
        suppress_health_check=_HEALTH,
        print_blob=True,
    )
    if NIGHTLY
    else settings(
        max_examples=int(_EXAMPLES or "30"),
        derandomize=True,
        database=None,
        deadline=None,
        suppress_health_check=_HEALTH,
        print_blob=True,
    )
)
