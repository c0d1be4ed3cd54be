"""ParquetDataset and ParquetStream end the way the tar paths do: a row
group that does not read raises at the batch that needs it, after every
good batch before it, and a skipping handler drops exactly its rows; a
server that stalls mid-body (the footers already read) holds neither
``DataLoader(timeout=)`` nor Ctrl-C, and the process then exits promptly;
``ParquetStream.close()`` on a stalled server and a daemon thread iterating
at interpreter exit let the process exit at once, with 0."""

from __future__ import annotations

import io
import signal
import subprocess
import sys
import textwrap
import time
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import chute
import chute.wds as wds
import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from helpers import child_env
from PIL import Image
from remote_servers import Fault, FaultProxy, ObjectServer

IMAGE = pa.struct([("bytes", pa.binary()), ("path", pa.string())])
ROWS, GROUP = 30, 10

# Hang detectors, not benchmarks. A child's whole run (an interpreter that
# imports torch, on a loaded machine) gets HANG_S. Its exit after its main
# code ended gets EXIT_S: before the fix, each of ParquetStream's reader
# threads blocked in a stalled read held the exit for its 5 s join (4
# readers: 20 s), and ParquetDataset's pool threads held it for as long as
# the server stalled (the reads' own timeout, 60 s, times the retries).
HANG_S = 120.0
EXIT_S = 12.0


def png(value: int) -> bytes:
    out = io.BytesIO()
    Image.fromarray(np.full((4, 6, 3), value % 251, np.uint8)).save(out, format="PNG")
    return out.getvalue()


def write_rows(path: Path, rows: int = ROWS) -> Path:
    images = [{"bytes": png(i), "path": None} for i in range(rows)]
    table = pa.table({"image": pa.array(images, IMAGE), "id": pa.array(range(rows))})
    pq.write_table(table, path, row_group_size=GROUP, compression="none")
    return path


@pytest.fixture(scope="module")
def bad_file(tmp_path_factory: pytest.TempPathFactory) -> str:
    """30 rows in row groups of 10; row group 1's pages overwritten with garbage."""
    path = write_rows(tmp_path_factory.mktemp("parquet_bad") / "bad.parquet")
    raw = bytearray(path.read_bytes())
    group = pq.read_metadata(path).row_group(1)
    for j in range(group.num_columns):
        at = group.column(j).data_page_offset
        raw[at : at + 24] = b"\xff" * 24
    path.write_bytes(bytes(raw))
    return str(path)


def ids_until_error(loader: Any, key: Any) -> tuple[list[int], BaseException | None]:
    got: list[int] = []
    try:
        for batch in loader:
            got.extend(int(i) for i in batch[key])
    except (chute.DataError, chute.ReadError) as e:
        return got, e
    return got, None


GOOD = list(range(GROUP)) + list(range(2 * GROUP, ROWS))


@pytest.mark.parametrize("decode", ["torchrgb8", None])
@pytest.mark.parametrize("workers", [0, 2])
def test_a_bad_row_group_raises_at_its_batch_after_every_good_one(
    bad_file: str, decode: str | None, workers: int
) -> None:
    # Before the fix the read ahead raised at once: 0 rows came with two
    # threads, 5 with none.
    ds = chute.ParquetDataset(bad_file, decode=decode)
    got, error = ids_until_error(chute.DataLoader(ds, batch_size=5, num_workers=workers), "id")
    assert got == list(range(GROUP))
    assert error is not None
    assert "row group 1: " in str(error) and "bad.parquet" in str(error)
    with pytest.raises(chute.DataError, match=r"file '.*bad.parquet', row group 1: "):
        ds[GROUP + 3]
    assert ds[2 * GROUP]["id"] == 2 * GROUP  # the dataset reads on


@pytest.mark.parametrize("decode", ["torchrgb8", None])
@pytest.mark.parametrize("workers", [0, 2])
def test_a_skipping_handler_drops_exactly_the_rows_of_the_bad_row_group(
    bad_file: str, decode: str | None, workers: int
) -> None:
    # Before the fix a row group that did not read raised whatever the handler.
    ds = chute.ParquetDataset(bad_file, decode=decode, handler=wds.warn_and_continue)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        got, error = ids_until_error(chute.DataLoader(ds, batch_size=5, num_workers=workers), "id")
    assert error is None and got == GOOD
    skipped = [w for w in caught if issubclass(w.category, chute.SkippedSampleWarning)]
    assert len(skipped) == GROUP
    assert all("row group 1: " in str(w.message) for w in skipped)
    assert ds.stats()["samples_skipped"] == GROUP
    # The row group is read again in the next epoch (a failing storage may recover).
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        again, _ = ids_until_error(chute.DataLoader(ds, batch_size=5, num_workers=workers), "id")
    assert again == GOOD and len(caught) == GROUP


@pytest.mark.parametrize("workers", [0, 2])
def test_the_stream_raises_at_the_bad_row_group_and_its_handler_skips_it(
    bad_file: str, workers: int
) -> None:
    def loader(handler: Any) -> Any:
        stream = wds.ParquetStream(bad_file, handler=handler, shardshuffle=False)
        batches = stream.decode("torchrgb8").to_tuple("image", "id").batched(5)
        return chute.DataLoader(batches, batch_size=None, num_workers=workers)

    got, error = ids_until_error(loader(wds.reraise_exception), 1)
    assert got == list(range(GROUP))
    assert error is not None and "row group 1: " in str(error)
    got, error = ids_until_error(loader(wds.ignore_and_continue), 1)
    assert error is None and got == GOOD


# -- a server that stalls, interpreter exit ---------------------------------------------


CHILD = """
import sys, threading, time
import chute, chute.wds as wds
from chute.remote import RemoteOptions

url, mode = sys.argv[1], sys.argv[2]
options = RemoteOptions(range_bytes=64 << 10, backoff_s=0.01, max_backoff_s=0.05)
if mode == "dataset-timeout":
    ds = chute.ParquetDataset(url, decode="torchrgb8", remote=options)
    try:
        for batch in chute.DataLoader(ds, batch_size=4, timeout=3):
            print("batch", flush=True)
    except TimeoutError as e:
        print("timeout:", e, flush=True)
elif mode == "dataset-interrupt":
    ds = chute.ParquetDataset(url, decode="torchrgb8", remote=options)
    print("ready", flush=True)
    try:
        for batch in chute.DataLoader(ds, batch_size=4):
            print("batch", flush=True)
    except KeyboardInterrupt:
        print("interrupted", flush=True)
elif mode == "stream-timeout":
    stream = wds.ParquetStream(url, shardshuffle=False, remote=options).batched(4)
    try:
        for batch in chute.DataLoader(stream, batch_size=None, timeout=3):
            print("batch", flush=True)
    except TimeoutError as e:
        print("timeout:", e, flush=True)
elif mode == "stream-close":
    stream = wds.ParquetStream(url, shardshuffle=False, remote=options)
    def iterate():
        try:
            for sample in stream:
                print("sample", flush=True)
        except Exception as e:
            print("ended:", type(e).__name__, flush=True)
    threading.Thread(target=iterate, daemon=True).start()
    print("ready", flush=True)
    sys.stdin.readline()  # the test saw the stalled requests
    stream.close()
print("main done", flush=True)
"""


@pytest.fixture(scope="module")
def stalled_file(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """The url of a file of 6 row groups whose every row group's ranges stall."""
    path = write_rows(tmp_path_factory.mktemp("parquet_stall") / "stall.parquet", 60)
    metadata = pq.read_metadata(path)
    with ObjectServer() as server:
        server.objects["/pq/stall.parquet"] = path.read_bytes()
        with FaultProxy(server.port) as proxy:
            assert isinstance(proxy, FaultProxy)
            for g in range(metadata.num_row_groups):
                chunk = metadata.row_group(g).column(0)
                start = chunk.data_page_offset
                if chunk.has_dictionary_page and 0 < chunk.dictionary_page_offset < start:
                    start = chunk.dictionary_page_offset
                proxy.add(Fault("stall", range_start=start, times=1000))
            yield f"{proxy.url}/pq/stall.parquet"


def run_child(url: str, mode: str, answer: bool = False) -> tuple[list[str], float]:
    """The child's output lines and how long its process lived after its
    main code ended. `answer`: after "ready" and the first stalled requests,
    the test writes a line to the child's stdin (dataset-interrupt: sends SIGINT)."""
    pytest.importorskip("obstore")
    with subprocess.Popen(
        [sys.executable, "-c", textwrap.dedent(CHILD), url, mode],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=child_env(),
    ) as proc:
        lines, ended = _follow(proc, mode, answer)
        assert proc.stderr is not None
        stderr = proc.stderr.read()
    assert proc.returncode == 0, stderr
    assert "terminate called" not in stderr and "Traceback" not in stderr, stderr
    assert ended is not None, (lines, stderr)
    return lines, time.monotonic() - ended


def _follow(proc: subprocess.Popen[str], mode: str, answer: bool) -> tuple[list[str], float | None]:
    """The child's lines until its main code ends, and when it did; waits
    for its exit (killed, and the test failed, after HANG_S)."""
    assert proc.stdin is not None and proc.stdout is not None
    deadline = time.monotonic() + HANG_S
    lines, ended = [], None
    try:
        for line in proc.stdout:
            lines.append(line.strip())
            if line.startswith("ready") and answer:
                time.sleep(1.0)  # let its readers reach the stalled requests
                if mode == "dataset-interrupt":
                    proc.send_signal(signal.SIGINT)
                else:
                    proc.stdin.write("go\n")
                    proc.stdin.flush()
            if line.startswith("main done"):
                ended = time.monotonic()
                break
        proc.wait(timeout=max(1.0, deadline - time.monotonic()))
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
        pytest.fail(f"{mode}: the child still ran after {HANG_S} s: {lines}")
    return lines, ended


@pytest.mark.parametrize("mode", ["dataset-timeout", "stream-timeout"])
def test_dataloader_timeout_raises_on_a_stalled_server_and_the_process_exits(
    stalled_file: str, mode: str
) -> None:
    # Before the fix ParquetDataset's consumer waited for the row group's
    # read without a timeout: still blocked after 90 s.
    lines, exit_s = run_child(stalled_file, mode)
    assert lines[-2].startswith("timeout: no batch within 3 seconds"), lines
    assert exit_s < EXIT_S


def test_ctrl_c_on_a_stalled_server_ends_the_process(stalled_file: str) -> None:
    # Before the fix KeyboardInterrupt came, but the exit joined the reader
    # threads, which waited on the stalled server.
    lines, exit_s = run_child(stalled_file, "dataset-interrupt", answer=True)
    assert lines[-2:] == ["interrupted", "main done"]
    assert exit_s < EXIT_S


def test_the_process_exits_at_once_after_closing_a_stream_on_a_stalled_server(
    stalled_file: str,
) -> None:
    # Before the fix: 18-25 s (each blocked reader's 5 s join at exit).
    lines, exit_s = run_child(stalled_file, "stream-close", answer=True)
    assert "sample" not in lines
    assert exit_s < EXIT_S


DAEMON = """
import sys, threading, time
import chute, chute.wds as wds

path, kind = sys.argv[1], sys.argv[2]
if kind == "stream":
    data = wds.ParquetStream(path, shardshuffle=False, readahead=4).decode("torchrgb8")
else:
    data = chute.DataLoader(chute.ParquetDataset(path, decode="torchrgb8", readahead=4),
                            batch_size=4, num_workers=2)
started = threading.Event()
def iterate():
    while True:
        for item in data:
            started.set()
threading.Thread(target=iterate, daemon=True).start()
started.wait()
time.sleep(float(sys.argv[3]))  # inside a read, a decode or a wait when Python exits
print("exiting", flush=True)
"""


@pytest.mark.parametrize("kind", ["stream", "dataset"])
def test_interpreter_exit_while_a_daemon_thread_iterates(tmp_path: Path, kind: str) -> None:
    # Before the fix ParquetDataset's exit could print "RuntimeError: cannot
    # schedule new futures after shutdown" from its daemon thread.
    path = write_rows(tmp_path / "rows.parquet", 400)
    runs = [
        subprocess.Popen(
            [sys.executable, "-c", textwrap.dedent(DAEMON), str(path), kind, pause],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=child_env(),
        )
        for pause in ("0", "0.05", "0.3")
    ]
    for proc in runs:
        out, err = proc.communicate(timeout=HANG_S)
        assert proc.returncode == 0, err
        assert out.strip() == "exiting"
        assert "terminate called" not in err and "Traceback" not in err, err
