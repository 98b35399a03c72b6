"""The coordinator's parts: one list (``PARTS``), each part a module that states its rules at
its top and owns its fields, composed by the façade; the architecture page follows the list."""

from __future__ import annotations

import importlib
import random
from pathlib import Path

from nsq_sansio.consumer import ConsumerCoordinator
from nsq_sansio.consumer.coordinator import PARTS

ROOT = Path(__file__).resolve().parents[2]


def test_each_part_states_its_rules_at_the_top_of_its_module() -> None:
    for module, _ in PARTS:
        doc = importlib.import_module(f"nsq_sansio.consumer.{module}").__doc__ or ""
        assert "Rules:" in doc, module


def test_the_facade_is_composed_of_the_parts() -> None:
    c = ConsumerCoordinator("t", "c", rng=random.Random(1), nsqd=["127.0.0.1:4150"])
    composed = {type(value).__module__.rsplit(".", 1)[-1] for value in vars(c).values()}
    assert {module for module, _ in PARTS} <= composed


def test_the_architecture_page_names_every_part() -> None:
    page = (ROOT / "docs" / "architecture.md").read_text(encoding="utf-8")
    for module, _ in PARTS:
        assert f"| `{module}.py` |" in page, module


def test_no_part_holds_the_facade() -> None:
    # Each part is handed what it needs (the links, the ledger, other parts, callbacks), never
    # the coordinator itself: what a part may touch is what its constructor names.
    c = ConsumerCoordinator("t", "c", rng=random.Random(1), nsqd=["127.0.0.1:4150"], pull=True)
    modules = {f"nsq_sansio.consumer.{module}" for module, _ in PARTS}
    parts = [value for value in vars(c).values() if type(value).__module__ in modules]
    assert len(parts) == len(PARTS)
    for part in parts:
        fields = dict(getattr(part, "__dict__", {}))
        fields.update((slot, getattr(part, slot, None)) for slot in getattr(part, "__slots__", ()))
        for name, value in fields.items():
            assert value is not c, (type(part).__name__, name)
