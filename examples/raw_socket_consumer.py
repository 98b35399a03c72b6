"""Consume a topic with a plain socket and the sans-IO core: no framework (docs/sans-io.md).

python examples/raw_socket_consumer.py 127.0.0.1:4150 events archive 10
"""

from __future__ import annotations

import socket
import sys
import time

from nsq_sansio import (
    ClientConnection,
    CloseWait,
    ConnectionClosed,
    ConnectionReady,
    Message,
    Subscribed,
)


def consume(address: str, topic: str, channel: str, count: int) -> list[bytes]:
    host, port = address.rsplit(":", 1)
    sock = socket.create_connection((host, int(port)))
    conn = ClientConnection({"client_id": "raw-socket", "heartbeat_interval": 5000})
    bodies: list[bytes] = []
    while True:
        sock.sendall(conn.data_to_send())  # IDENTIFY, SUB, RDY, FIN, heartbeat NOPs, CLS
        deadline = conn.next_deadline()  # the core's timers: when to call handle_timer
        sock.settimeout(None if deadline is None else max(0.0, deadline - time.monotonic()))
        try:
            data = sock.recv(65536)  # b"" at EOF
        except TimeoutError:
            events = conn.handle_timer(time.monotonic())
        else:
            events = conn.receive_data(data, now=time.monotonic())
        for event in events:
            if isinstance(event, ConnectionReady):  # IDENTIFY answered (and upgrades done)
                conn.subscribe(topic, channel)
            elif isinstance(event, Subscribed):
                conn.send_ready(min(count, 100))
            elif isinstance(event, Message) and len(bodies) < count:
                bodies.append(event.body)
                conn.finish(event.id)
                if len(bodies) == count:
                    conn.close()  # CLS: nsqd answers CLOSE_WAIT, then it is ours to close
            elif isinstance(event, (CloseWait, ConnectionClosed)):
                sock.close()
                return bodies


if __name__ == "__main__":
    address, topic, channel, count = sys.argv[1:5]
    for body in consume(address, topic, channel, int(count)):
        print(body.decode(errors="replace"))
