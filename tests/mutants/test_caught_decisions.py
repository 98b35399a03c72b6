"""Decisions of the core that no test pinned down until a planted bug of ``planted.py``
survived the suite: each test here names the mutant it catches. Plain, fast tests of the
default suite (the mutants themselves run only when asked, see ``run.py``).
"""

from __future__ import annotations

from consumer.harness import World
from core._helpers import identify_answer
from core._servers import ServerStream

from nsq_sansio import ClientConnection, ConnectionState
from nsq_sansio.config import Config
from nsq_sansio.consumer import RDY_SETTLE_MIN
from nsq_sansio.events import ConnectionReady


def _a_holds_ten_when_b_joins(msg_timeout: float) -> tuple[World, int]:
    """Two nsqd, max_in_flight 10: the user holds 10 messages from A (never answered) when B
    subscribes and A's RDY is lowered to make room. Returns the world and B's conn_id."""
    w = World(2, Config(max_in_flight=10), node_options={"msg_timeout": msg_timeout})
    w.kill(1)
    w.start()
    w.publish(0, 30)
    assert len(w.inbox) == 10 and w.rdy_by_conn() == {1: 10}
    w.revive(1)
    w.publish(1, 30)
    while len(w.coordinator.connection_ids()) < 2:
        w.advance(0.01)
    [b] = [conn_id for conn_id in w.coordinator.connection_ids() if conn_id != 1]
    assert w.rdy_by_conn() == {1: 9, b: 0}  # lowered on A; B waits for a slot that is free
    return w, b


def test_an_answer_near_the_messages_deadline_frees_no_slot_of_a_lowered_rdy() -> None:
    """Catches ``rdy-expired-answer-frees-a-slot``. A FIN written after a lowered RDY frees
    one slot of the old RDY for good (nsqd reads it after the RDY), so another connection may
    have it at once; but not a FIN of a message nsqd may time out before reading it: nsqd
    frees that slot itself at the timeout and may fill it again under the old RDY, so it is
    counted only when the ceiling settles."""
    w, b = _a_holds_ten_when_b_joins(msg_timeout=2.0)
    deadline = w.inbox[0].deadline
    assert w.now < deadline - RDY_SETTLE_MIN  # B joined early enough for the contrast below
    w.advance(deadline - RDY_SETTLE_MIN / 2 - w.now)  # within settle_delay of the deadline
    assert w.rdy_by_conn()[b] == 0
    assert w.coordinator.finish(w.inbox.pop(0), w.now)
    w.pump()
    assert w.rdy_by_conn()[b] == 0, "a FIN nsqd may read after the timeout freed a slot"

    # The same answer well before the deadline frees the slot: B gets RDY at once.
    w, b = _a_holds_ten_when_b_joins(msg_timeout=60.0)
    assert w.coordinator.finish(w.inbox.pop(0), w.now)
    w.pump()
    assert w.rdy_by_conn()[b] >= 1


def test_what_was_queued_before_the_compression_switch_goes_out_uncompressed() -> None:
    """Catches ``compression-compresses-queued-output``. The magic and IDENTIFY are queued
    when the connection is made; a transport that feeds nsqd's answer before taking them (a
    test, a replay) must still get them uncompressed, and only what follows compressed:
    nsqd reads the bytes before the switch as plain ones."""
    for kind in ("snappy", "deflate"):
        conn = ClientConnection({kind: True})
        queued = b"".join(conn._out)  # the magic and IDENTIFY, not taken yet
        assert queued.startswith(b"  V2IDENTIFY\n")
        server = ServerStream(kind)
        events = conn.receive_data(identify_answer(**{kind: True}) + server.compress(b""))
        events += conn.receive_data(server.compress(b"\x00\x00\x00\x06\x00\x00\x00\x00OK"))
        assert [type(e) for e in events] == [ConnectionReady]
        assert conn.state is ConnectionState.READY
        conn.subscribe("t", "c")
        out = conn.data_to_send()
        assert out.startswith(queued), kind
        assert server.decompress(out[len(queued) :]) == b"SUB t c\n", kind
