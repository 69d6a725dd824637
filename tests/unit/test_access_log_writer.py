"""The access log's batch writer (http/accesslog.py `BatchWriter`, `configure`).

Lines from the event loop's thread reach the sink whole, in order, none lost
while the writer thread takes batches; `stop` writes what is left; each write
is whole lines within PIPE_BUF; a file moved away by logrotate is reopened,
and a logging reconfiguration (vLLM's import) does not close it; handlers on
the `streamproxy.access` logger still get every line; `off` writes nothing.
"""

from __future__ import annotations

import io
import logging
import threading
from pathlib import Path

import pytest

from streamproxy.http import accesslog


@pytest.fixture
def restore():
    yield
    accesslog.configure("off")


def _stream_writer() -> tuple[accesslog.BatchWriter, io.StringIO]:
    out = io.StringIO()
    return accesslog.BatchWriter(accesslog.StreamSink(out)), out


def test_every_line_in_order_while_the_thread_takes_batches():
    writer, out = _stream_writer()
    sent = [f'{{"n":{i}}}' for i in range(20_000)]
    pause = threading.Event()  # never set: a sleep
    for i, text in enumerate(sent):
        writer.add(text)
        if i % 2_000 == 0:  # let the writer thread take batches in the middle of the run
            pause.wait(0.06)
    writer.stop()
    assert out.getvalue() == "\n".join(sent) + "\n"


def test_each_write_is_whole_lines_within_pipe_buf():
    """Several processes share one stdout (--api-server-count): a write(2) of at most PIPE_BUF
    bytes is atomic, so each write is whole lines of at most that size."""
    writes: list[str] = []

    class Recorder(io.StringIO):
        def flush(self) -> None:
            writes.append(self.getvalue())
            self.seek(0)
            self.truncate()

    writer = accesslog.BatchWriter(accesslog.StreamSink(Recorder()))
    sent = [("é" * (i % 300)) + str(i) for i in range(3_000)] + ["x" * 10_000]
    for text in sent:
        writer.add(text)
    writer.stop()
    chunks = [w for w in writes if w]
    assert "".join(chunks) == "\n".join(sent) + "\n"
    assert 100 < len(chunks) < len(sent) // 5  # batched: neither one write per line nor one for all
    for chunk in chunks[:-1]:
        assert chunk.endswith("\n") and len(chunk.encode()) <= accesslog.ATOMIC_WRITE
    assert chunks[-1] == "x" * 10_000 + "\n"  # a longer line: a write of its own


def test_lines_are_written_without_stop_within_the_flush_interval():
    writer, out = _stream_writer()
    writer.add("one")
    done = threading.Event()
    for _ in range(200):
        if out.getvalue():
            break
        done.wait(0.01)
    try:
        assert out.getvalue() == "one\n"
    finally:
        writer.stop()


def test_a_file_moved_away_is_reopened(tmp_path: Path, restore):
    path = tmp_path / "access.log"
    writer = accesslog.configure(str(path))
    assert writer is not None
    accesslog.write("before")
    writer.stop()  # flushes
    path.rename(tmp_path / "access.log.1")
    writer = accesslog.configure(str(path))
    assert writer is not None
    accesslog.write("after")
    writer.stop()
    assert (tmp_path / "access.log.1").read_text() == "before\n"
    assert path.read_text() == "after\n"


def test_logrotate_while_running(tmp_path: Path, restore):
    path = tmp_path / "access.log"
    writer = accesslog.configure(str(path))
    assert writer is not None
    accesslog.write("first")
    writer._flush()  # as the thread would (the test does not wait for the interval)
    path.rename(tmp_path / "access.log.1")
    accesslog.write("second")
    writer.stop()
    assert (tmp_path / "access.log.1").read_text() == "first\n"
    assert path.read_text() == "second\n"


def test_a_logging_reconfiguration_does_not_stop_the_file(tmp_path: Path, restore):
    """Importing vLLM runs `logging.config.dictConfig`, which closes every logging handler there is:
    the access log's file is not one (it stopped being written in `--api-server-count` workers)."""
    import logging.config

    path = tmp_path / "access.log"
    writer = accesslog.configure(str(path))
    assert writer is not None
    accesslog.write("before")
    logging.config.dictConfig({"version": 1, "disable_existing_loggers": False})
    accesslog.write("after")
    writer.stop()
    assert path.read_text() == "before\nafter\n"


def test_logger_handlers_get_each_line_too(restore):
    lines: list[str] = []

    class Collect(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            lines.append(record.getMessage())

    handler = Collect()
    previous = accesslog.log.level
    accesslog.log.addHandler(handler)
    accesslog.log.setLevel(logging.INFO)
    try:
        writer, out = _stream_writer()
        accesslog._writer = writer
        assert accesslog.enabled()
        accesslog.write("x")
        writer.stop()
        assert out.getvalue() == "x\n" and lines == ["x"]
    finally:
        accesslog.log.removeHandler(handler)
        accesslog.log.setLevel(previous)


def test_off_writes_nothing_and_is_not_enabled(restore):
    saved = list(accesslog.log.handlers)
    for handler in saved:
        accesslog.log.removeHandler(handler)
    try:
        assert accesslog.configure("stdout") is not None and accesslog.enabled()
        assert accesslog.configure("off") is None
        assert not accesslog.enabled()
        accesslog.write("nowhere")  # no writer, no error
    finally:
        for handler in saved:
            accesslog.log.addHandler(handler)
