"""A scripted client for driving the pure nsqd role in tests: bytes in, decoded frames out."""

from __future__ import annotations

import json
import random
from typing import Any

from nsq_sansio import frames
from nsq_sansio.events import Message
from nsq_sansio.server import NSQD, ClientState, CloseConnection, NSQDOptions, ServerEvent

RESPONSE, ERROR, MESSAGE = 0, 1, 2


def make_node(**options: Any) -> NSQD:
    """A node with deterministic randomness and the given option overrides."""
    return NSQD(NSQDOptions(**options), random.Random(7))


class Client:
    """One connection to a node: ``send`` raw bytes, read back what the node answered."""

    def __init__(self, node: NSQD, now: float = 0.0, *, magic: bool = True) -> None:
        self.node = node
        self.id = node.connect(now, f"10.0.0.1:{40000 + len(node.connection_ids())}")
        self.decoder = frames.FrameDecoder()
        self.events: list[ServerEvent] = []
        if magic:
            self.send(frames.MAGIC_V2, now)

    def send(self, data: bytes, now: float = 0.0) -> list[ServerEvent]:
        events = self.node.receive_data(self.id, data, now)
        self.events.extend(events)
        return events

    def raw(self) -> bytes:
        return self.node.data_to_send(self.id)

    def frames(self) -> list[tuple[int, bytes]]:
        return self.decoder.feed(self.raw())

    def responses(self) -> list[bytes]:
        """Payloads of every response and error frame (message frames are left out)."""
        return [data for kind, data in self.frames() if kind != MESSAGE]

    def messages(self) -> list[Message]:
        return [frames.decode_message(data) for kind, data in self.frames() if kind == MESSAGE]

    @property
    def closed(self) -> bool:
        """The node told this connection to close (events from ``send``) or has forgotten it."""
        if any(isinstance(e, CloseConnection) and e.conn_id == self.id for e in self.events):
            return True
        return self.node.connection_state(self.id) is ClientState.CLOSED

    # command helpers -------------------------------------------------------------------

    def identify(self, now: float = 0.0, **fields: Any) -> Any:
        fields.setdefault("feature_negotiation", True)
        self.send(frames.encode_identify(fields), now)
        got = self.frames()
        assert got, "no answer to IDENTIFY"
        kind, data = got[0]
        if kind == RESPONSE and data.startswith(b"{"):
            return json.loads(data)
        return data

    def sub(self, topic: str, channel: str, rdy: int | None = None, now: float = 0.0) -> None:
        self.send(frames.encode_sub(topic, channel), now)
        assert self.responses() == [b"OK"]
        if rdy is not None:
            self.send(frames.encode_rdy(rdy), now)

    def pub(self, topic: str, body: bytes, now: float = 0.0) -> bytes:
        self.send(frames.encode_pub(topic, body), now)
        (answer,) = self.responses()
        return answer


def error_text(data: bytes) -> str:
    return data.decode()
