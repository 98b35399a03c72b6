"""A few protocol V2 commands by hand (blocking sockets), to put messages into a broker and
hold some in flight or deferred while the admin client looks: independent of the clients, so
the admin tests depend on the broker and the admin code alone."""

from __future__ import annotations

import json
import socket
import struct

_TIMEOUT = 10.0


def _address(address: str) -> tuple[str, int]:
    host, _, port = address.rpartition(":")
    return host.strip("[]"), int(port)


class Wire:
    """One V2 connection: publish, subscribe, RDY, FIN, REQ; reads skip heartbeats."""

    def __init__(self, address: str, user_agent: str = "admin-tests/1") -> None:
        self.sock = socket.create_connection(_address(address), timeout=_TIMEOUT)
        self.buf = b""
        identify = json.dumps({"user_agent": user_agent, "client_id": "admin-tests"}).encode()
        self.sock.sendall(b"  V2IDENTIFY\n" + struct.pack(">i", len(identify)) + identify)
        self.expect_ok()

    def close(self) -> None:
        self.sock.close()

    def __enter__(self) -> Wire:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _frame(self) -> tuple[int, bytes]:
        while True:
            while len(self.buf) < 4 or len(self.buf) < 4 + struct.unpack(">i", self.buf[:4])[0]:
                chunk = self.sock.recv(65536)
                if not chunk:
                    raise ConnectionError("the broker closed the connection")
                self.buf += chunk
            size = struct.unpack(">i", self.buf[:4])[0]
            kind = struct.unpack(">i", self.buf[4:8])[0]
            data, self.buf = self.buf[8 : 4 + size], self.buf[4 + size :]
            if kind == 0 and data == b"_heartbeat_":
                self.sock.sendall(b"NOP\n")
                continue
            return kind, data

    def expect_ok(self) -> None:
        kind, data = self._frame()
        assert kind == 0 and (data == b"OK" or data.startswith(b"{")), (kind, data)

    def publish(self, topic: str, bodies: list[bytes]) -> None:
        payload = struct.pack(">i", len(bodies)) + b"".join(
            struct.pack(">i", len(b)) + b for b in bodies
        )
        self.sock.sendall(f"MPUB {topic}\n".encode() + struct.pack(">i", len(payload)) + payload)
        self.expect_ok()

    def subscribe(self, topic: str, channel: str) -> None:
        self.sock.sendall(f"SUB {topic} {channel}\n".encode())
        self.expect_ok()

    def rdy(self, count: int) -> None:
        self.sock.sendall(f"RDY {count}\n".encode())

    def message_id(self) -> str:
        """The id of the next message delivered."""
        kind, data = self._frame()
        assert kind == 2, (kind, data)
        return data[10:26].decode()

    def finish(self, message_id: str) -> None:
        self.sock.sendall(f"FIN {message_id}\n".encode())

    def requeue(self, message_id: str, delay_ms: int) -> None:
        self.sock.sendall(f"REQ {message_id} {delay_ms}\n".encode())

    def closed_by_broker(self) -> bool:
        """Whether the broker closed the connection (reads until EOF or the timeout)."""
        try:
            while self.sock.recv(65536):
                pass
        except TimeoutError:
            return False
        except OSError:  # reset
            return True
        return True


def publish(address: str, topic: str, bodies: list[bytes]) -> None:
    with Wire(address) as wire:
        wire.publish(topic, bodies)
