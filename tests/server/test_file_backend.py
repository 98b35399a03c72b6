"""The durable file backend: FIFO, survives close/reopen and crashes, and backs a real node."""

from __future__ import annotations

import random
import stat
import uuid
from collections import deque
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from nsq_sansio import frames
from nsq_sansio.server import NSQD, BackendError, NSQDOptions
from transports.embedded.file_backend import (
    FileBackend,
    FileBackendFactory,
    load_metadata,
    save_metadata,
)

from ._wire import Client


def test_fifo_and_reopen(tmp_path: Path) -> None:
    backend = FileBackend(tmp_path, "t:c")
    for i in range(5):
        backend.put(b"record-%d" % i)
    assert backend.get() == b"record-0"
    backend.close()
    reopened = FileBackend(tmp_path, "t:c")
    assert reopened.depth == 4
    assert [reopened.get() for _ in range(4)] == [b"record-%d" % i for i in range(1, 5)]
    assert reopened.get() is None and reopened.depth == 0
    assert reopened.data_file.stat().st_size == 0  # read to the end: the file starts over


def test_crash_without_close_loses_nothing(tmp_path: Path) -> None:
    backend = FileBackend(tmp_path, "t", sync_every=2)
    for i in range(6):
        backend.put(b"%d" % i)
    assert [backend.get() for _ in range(3)] == [b"0", b"1", b"2"]
    backend._writer.flush()  # the OS has the bytes; the process dies without close()
    survivor = FileBackend(tmp_path, "t", sync_every=2)
    # the position was saved after 2 reads: "2" comes again (at least once), nothing is lost
    assert [survivor.get() for _ in range(survivor.depth)] == [b"2", b"3", b"4", b"5"]


def test_reopening_a_cleanly_closed_queue_does_not_read_its_records(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A restart with a large backlog must not walk every record before serving:
    # the depth and write position saved at close are trusted; only what was appended after
    # the saved position is scanned.
    from transports.embedded import file_backend

    backend = FileBackend(tmp_path, "t")
    for i in range(1000):
        backend.put(b"record-%04d" % i)
    backend.close()
    with open(backend.data_file, "ab") as handle:  # appended after the last save (a crash)
        handle.write(b"\x00\x00\x00\x04late" + b"\x00\x00\x00\x10torn")
    read_sizes: list[int] = []
    real_open = open

    class CountingReader:
        def __init__(self, handle: Any) -> None:
            self.handle = handle

        def read(self, size: int = -1) -> bytes:
            data: bytes = self.handle.read(size)
            read_sizes.append(len(data))
            return data

        def __getattr__(self, name: str) -> Any:
            return getattr(self.handle, name)

        def __enter__(self) -> CountingReader:
            return self

        def __exit__(self, *exc: object) -> None:
            self.handle.close()

    def counting_open(path: Any, mode: str = "r", *args: Any, **kwargs: Any) -> Any:
        handle = real_open(path, mode, *args, **kwargs)
        return CountingReader(handle) if mode == "rb" else handle

    monkeypatch.setattr(file_backend, "open", counting_open, raising=False)
    reopened = FileBackend(tmp_path, "t")
    monkeypatch.undo()
    assert reopened.depth == 1001 and reopened.discarded_bytes == 8
    assert sum(read_sizes) < 64, read_sizes  # the tail only, not 1000 records
    assert [reopened.get() for _ in range(1001)][-2:] == [b"record-0999", b"late"]


def test_a_meta_file_without_the_write_position_still_opens(tmp_path: Path) -> None:
    backend = FileBackend(tmp_path, "t")
    for i in range(3):
        backend.put(b"%d" % i)
    backend.close()
    backend.meta_file.write_text('{"read_pos": 0, "depth": 3}')  # as older versions wrote it
    reopened = FileBackend(tmp_path, "t")
    assert [reopened.get() for _ in range(reopened.depth)] == [b"0", b"1", b"2"]


def test_torn_record_is_cut_off(tmp_path: Path) -> None:
    backend = FileBackend(tmp_path, "t")
    backend.put(b"whole")
    backend.close()
    with open(backend.data_file, "ab") as handle:
        handle.write(b"\x00\x00\x00\x10part")  # announces 16 bytes, has 4
    reopened = FileBackend(tmp_path, "t")
    assert reopened.depth == 1 and reopened.discarded_bytes == 8
    assert reopened.get() == b"whole"
    reopened.put(b"next")
    assert reopened.get() == b"next"


def test_corrupt_length_is_cut_off(tmp_path: Path) -> None:
    backend = FileBackend(tmp_path, "t", max_record_size=100)
    backend.put(b"ok")
    backend.close()
    with open(backend.data_file, "ab") as handle:
        handle.write(b"\xff\xff\xff\xff" + b"x" * 20)
    reopened = FileBackend(tmp_path, "t", max_record_size=100)
    assert reopened.depth == 1 and reopened.get() == b"ok"
    with pytest.raises(BackendError):
        reopened.put(b"y" * 101)


def test_empty_and_delete(tmp_path: Path) -> None:
    backend = FileBackend(tmp_path, "t")
    backend.put(b"a")
    backend.empty()
    assert backend.depth == 0 and backend.get() is None
    backend.put(b"b")
    backend.delete()
    assert not backend.data_file.exists() and not backend.meta_file.exists()
    with pytest.raises(BackendError):
        backend.put(b"c")


def test_compaction_keeps_order(tmp_path: Path) -> None:
    backend = FileBackend(tmp_path, "t", sync_every=1, compact_bytes=50)
    for i in range(40):
        backend.put(b"%02d" % i)
    got = [backend.get() for _ in range(30)]
    assert backend.data_file.stat().st_size < 40 * 6
    backend.put(b"40")
    got += [backend.get() for _ in range(11)]
    assert got == [b"%02d" % i for i in range(41)]


@settings(
    max_examples=50, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    st.lists(
        st.one_of(
            st.tuples(st.just("put"), st.binary(max_size=30)),
            st.tuples(st.just("get"), st.none()),
            st.tuples(st.just("reopen"), st.none()),
        ),
        max_size=60,
    )
)
def test_behaves_like_a_deque(tmp_path: Path, ops: list[tuple[str, bytes | None]]) -> None:
    directory = tmp_path / uuid.uuid4().hex
    backend = FileBackend(directory, "q", sync_every=3, compact_bytes=20)
    model: deque[bytes] = deque()
    for op, value in ops:
        if op == "put":
            assert value is not None
            backend.put(value)
            model.append(value)
        elif op == "get":
            assert backend.get() == (model.popleft() if model else None)
        else:
            backend.close()
            backend = FileBackend(directory, "q", sync_every=3, compact_bytes=20)
        assert backend.depth == len(model)
    backend.close()


def test_node_restart_on_file_backends(tmp_path: Path) -> None:
    options = NSQDOptions(mem_queue_size=2)
    node = NSQD(options, random.Random(1), backend_factory=FileBackendFactory(tmp_path))
    consumer = Client(node)
    consumer.sub("t", "c", rdy=1)
    node.multi_publish("t", [b"%d" % i for i in range(6)], 0.0)
    (held,) = consumer.messages()
    save_metadata(tmp_path, node.metadata())
    node.close(1.0)

    restarted = NSQD(options, random.Random(2), backend_factory=FileBackendFactory(tmp_path))
    metadata = load_metadata(tmp_path)
    assert metadata is not None
    restarted.load_metadata(metadata, 2.0)
    again = Client(restarted, now=2.0)
    again.sub("t", "c", rdy=100, now=2.0)
    got = again.messages()
    assert sorted(m.body for m in got) == [b"%d" % i for i in range(6)]
    (redelivered,) = [m for m in got if m.id == held.id]
    assert redelivered.attempts == 2  # it was in flight once before the restart
    for msg in got:
        again.send(frames.encode_fin(msg.id), 2.0)
    assert restarted.stats(2.0)["topics"][0]["channels"][0]["in_flight_count"] == 0


def test_load_metadata_missing_or_bad(tmp_path: Path) -> None:
    assert load_metadata(tmp_path) is None
    (tmp_path / "nsqd.dat").write_bytes(b"[1]")
    assert load_metadata(tmp_path) is None


def test_files_are_private_and_links_are_not_followed(tmp_path: Path) -> None:
    """nsqd writes its queue and metadata files 0600; a symbolic link planted where one of
    them goes (data folders are often under /tmp) is refused, never written through."""
    data = tmp_path / "data"
    backend = FileBackend(data, "t:c")
    backend.put(b"x" * 30)
    backend.close()
    save_metadata(data, {"topics": []})
    assert stat.S_IMODE(data.stat().st_mode) == 0o700
    files = sorted(data.iterdir())
    assert files
    for path in files:
        assert stat.S_IMODE(path.stat().st_mode) == 0o600, path
    # a file an older version left 0644 is narrowed when reopened
    backend.data_file.chmod(0o644)
    FileBackend(data, "t:c").close()
    assert stat.S_IMODE(backend.data_file.stat().st_mode) == 0o600
    # planted links: the queue's data file, and the metadata's temporary file
    victim = tmp_path / "victim"
    victim.write_bytes(b"untouched")
    (data / "u.diskqueue.dat").symlink_to(victim)
    with pytest.raises(OSError):
        FileBackend(data, "u")
    (data / "nsqd.dat.tmp").symlink_to(victim)
    with pytest.raises(OSError):
        save_metadata(data, {"topics": []})
    assert victim.read_bytes() == b"untouched"
