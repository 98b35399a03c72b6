"""Round-trip messages through the sans-IO core in memory: no sockets, no broker.

A scripted "nsqd" (plain bytes built with the codec) answers a client connection that negotiates
snappy, subscribes, receives messages, finishes them and closes cleanly.
"""

from __future__ import annotations

import json
import sys

from nsq_sansio import ClientConnection, CloseWait, ConnectionClosed, Message
from nsq_sansio.compression import SnappyCodec
from nsq_sansio.frames import FrameType, encode_frame, encode_message_frame


def main(count: int = 10_000) -> int:
    client = ClientConnection({"client_id": "roundtrip", "snappy": True})
    server = SnappyCodec()
    assert client.data_to_send().startswith(b"  V2IDENTIFY\n")
    answer = json.dumps({"max_rdy_count": 2500, "snappy": True, "version": "roundtrip"}).encode()
    client.receive_data(encode_frame(FrameType.RESPONSE, answer))
    client.receive_data(server.compress(encode_frame(FrameType.RESPONSE, b"OK")))
    client.subscribe("events", "archive")
    client.receive_data(server.compress(encode_frame(FrameType.RESPONSE, b"OK")))
    client.send_ready(2500)
    stream = b"".join(
        encode_message_frame(b"%016x" % i, i, 1, b"payload-%d" % i) for i in range(count)
    )
    finished = 0
    for start in range(0, len(stream), 65536):
        for event in client.receive_data(server.compress(stream[start : start + 65536])):
            if isinstance(event, Message):
                client.finish(event.id)
                finished += 1
    client.data_to_send()
    client.close()
    events = client.receive_data(server.compress(encode_frame(FrameType.RESPONSE, b"CLOSE_WAIT")))
    events += client.receive_data(b"")
    clean = any(isinstance(e, CloseWait) for e in events) and any(
        isinstance(e, ConnectionClosed) and e.error is None for e in events
    )
    print(f"published {count}, finished {finished}, clean close: {clean}")
    return 0 if finished == count and clean else 1


if __name__ == "__main__":
    sys.exit(main(int(sys.argv[1]) if len(sys.argv) > 1 else 10_000))
