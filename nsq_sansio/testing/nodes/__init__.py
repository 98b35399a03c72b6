"""Simulated nodes, one module per kind: the core's state machines (nsqd, nsqlookupd, consumer,
producer) driven exactly as a transport would drive them, but over the simulated network and
clock. :mod:`.base` holds what they share (:class:`SimNode`, the crash-surviving
:class:`SimDisk`)."""

from __future__ import annotations

from ..handler import HANG, Handler
from .base import Hooks, SimNode, World
from .consumer import ConsumerNode, ConsumerStats
from .lookupd import LookupdNode
from .nsqd import NsqdNode, SimDisk
from .producer import ProducerNode

__all__ = [
    "HANG",
    "ConsumerNode",
    "ConsumerStats",
    "Handler",
    "Hooks",
    "LookupdNode",
    "NsqdNode",
    "ProducerNode",
    "SimDisk",
    "SimNode",
    "World",
]
