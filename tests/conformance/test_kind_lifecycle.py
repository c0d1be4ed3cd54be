"""The lifecycle every data kind passes (docs/errors.md), local and, for the
kinds that read remote urls, from a faulty server on 127.0.0.1
(tests/remote_servers.py):

1. ``close()`` from another thread ends the epoch: the dataset's own
   ``close()`` where it has one (streams), else the iteration's; the next
   ``next()`` ends it and the engine's threads are gone;
2. ``DataLoader(timeout=)`` bounds the wait for a batch that a stalled
   server never sends (TimeoutError, promptly);
3. a sample that cannot be read fails the batch it belongs to, after every
   earlier batch was delivered whole, however far the loader reads ahead;
4. the interpreter exits normally while a daemon thread iterates (a fresh
   interpreter per kind), and promptly while that thread waits on a
   stalled server.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path
from typing import Any

import pytest
from factories import Factory, N, Setting, all_factories
from rank_runs import data_fixture
from remote_servers import Fault, FaultProxy, ObjectServer

# scripts/sanitize.sh runs the suite's default profile under ASan and TSan.
pytestmark = pytest.mark.native

written = data_fixture()

# Each ending must come within this: a hang detector, not a benchmark.
PROMPT_S = 25.0
# The children of the exit tests print every thread's stack if they crash
# (what a failure in CI must show: a crash at exit is rare and timing-bound).
CHILD_ENV = {**os.environ, "PYTHONFAULTHANDLER": "1"}
# A loader's timeout of 2 s must end a stalled read within this after it
# (shorter than PROMPT_S: the kinds the timeout does not reach wait it out).
STALL_PROMPT_S = 10.0


def cases(*, having: str | None = None) -> list[Any]:
    """The factories (one per kind variant), those without `having` left out."""
    return [
        pytest.param(f, id=f.name)
        for f in all_factories()
        if having is None or getattr(type(f), having) is not getattr(Factory, having)
    ]


def tasks() -> int:
    return len(os.listdir("/proc/self/task"))


def settles_to(count: int) -> bool:
    """Whether the threads of this process come down to `count` (a joined
    thread leaves /proc a moment after its join)."""
    deadline = time.monotonic() + PROMPT_S
    while tasks() > count:
        if time.monotonic() > deadline:
            return False
        time.sleep(0.02)
    return True


@pytest.mark.parametrize("factory", cases())
def test_close_from_another_thread_ends_the_epoch(factory: Factory, written) -> None:
    s = factory.adapt(Setting(threads=2, batch=4, shuffle=False))
    data = written(factory, s.shards)
    loader = factory.loader(data, s)
    # What lives as long as the dataset (reader pools, an engine kept for
    # the next epoch) starts in a first epoch.
    for _ in loader:
        pass
    before = tasks()
    it = iter(loader)
    first = factory.ids(next(it))
    assert len(first) == 4
    close = getattr(loader.dataset, "close", None)
    target = close if callable(close) else it.close
    closer = threading.Thread(target=target)
    closer.start()
    closer.join(PROMPT_S)
    assert not closer.is_alive()
    rest = list(it)
    # Streams stop at once; nothing was running in a closed generator.
    assert rest == [] or not callable(close)
    del it
    assert settles_to(before), f"{tasks() - before} threads outlived the closed epoch"


@pytest.mark.parametrize("factory", cases(having="corrupt"))
@pytest.mark.parametrize("threads", [0, 2])
def test_an_error_arrives_with_its_batch(factory: Factory, tmp_path: Path, threads: int) -> None:
    found = factory.corrupt(tmp_path)
    assert found is not None
    data, bad = found
    s = factory.adapt(Setting(threads=threads, batch=4, shuffle=False, shards=3))
    delivered: list[list[int]] = []
    with pytest.raises(Exception) as info:
        for batch in factory.loader(data, s):
            delivered.append(factory.ids(batch))
    assert not isinstance(info.value, (StopIteration, AssertionError))
    order = list(range(N))  # unshuffled: the ids in order
    failing = min(i // s.batch for i, sample in enumerate(order) if sample in bad)
    expected = [order[k * s.batch : (k + 1) * s.batch] for k in range(failing)]
    assert delivered == expected, f"{info.value!r} came after {len(delivered)} batches"


@pytest.mark.parametrize(
    "factory",
    cases(having="objects"),
)
def test_timeout_bounds_a_stalled_read(factory: Factory, written, tmp_path: Path) -> None:
    s = factory.adapt(Setting(threads=2, batch=4, shuffle=False))
    objects = factory.objects(written(factory, s.shards))
    assert objects is not None
    with ObjectServer() as server, FaultProxy(server.port) as proxy:
        assert isinstance(server, ObjectServer) and isinstance(proxy, FaultProxy)
        for name, body in objects.items():
            server.objects[f"/data/{name}"] = body
        urls = [f"{proxy.url}/data/{name}" for name in objects]
        loader = factory.remote_loader(urls, s, timeout=2.0, scratch=tmp_path)
        # What opening read (footers, indexes) is done: every read from now stalls.
        stall = proxy.add(Fault("stall", times=10_000))
        ended: list[BaseException | None] = []

        def consume() -> None:
            try:
                for _ in loader:
                    pass
                ended.append(None)
            except BaseException as exc:
                ended.append(exc)

        # On a thread, so that a loader the timeout does not reach fails
        # the test rather than hanging it (the stall released lets it end).
        consumer = threading.Thread(target=consume, daemon=True)
        try:
            consumer.start()
            consumer.join(2.0 + STALL_PROMPT_S)
            assert not consumer.is_alive(), "the loader's timeout did not end the stalled read"
        finally:
            stall.release.set()
            consumer.join(PROMPT_S)
        assert ended and isinstance(ended[0], TimeoutError), ended


STALLED_EXIT = """
import os, pathlib, sys, threading, time
sys.path[:0] = {paths!r}
import factories
from remote_servers import Fault, FaultProxy, ObjectServer
factory = next(f for f in factories.all_factories() if f.name == {name!r})
setting = factory.adapt(factories.Setting(threads=2, batch=4, shuffle=False))
root = pathlib.Path({root!r})
objects = factory.objects(factory.write(root, setting.shards))
server = ObjectServer().__enter__()
proxy = FaultProxy(server.port).__enter__()
for name, body in objects.items():
    server.objects["/data/" + name] = body
urls = [proxy.url + "/data/" + name for name in objects]
loader = factory.remote_loader(urls, setting, timeout=0.0, scratch=root / "scratch")
stall = proxy.add(Fault("stall", times=10_000))
def consume():
    try:
        for batch in loader:
            pass
    except BaseException as exc:
        # Exit ends the stalled reads; the thread waiting on them must stay
        # parked, not run on while the interpreter finalizes.
        os.write(2, f"the consumer ran on at exit: {{exc!r}}\\n".encode())
threading.Thread(target=consume, daemon=True).start()
assert stall.hit.wait(60), "no read reached the stalled server"
time.sleep(0.3)  # its readers are inside the stalled reads when the interpreter exits
print("exiting", flush=True)
import faulthandler
faulthandler.dump_traceback_later({dump_s})  # where a slow exit waits, for the failure
"""


@pytest.mark.parametrize("factory", cases(having="objects"))
def test_interpreter_exit_with_a_daemon_thread_on_a_stalled_server(
    factory: Factory, tmp_path: Path
) -> None:
    import chute

    here = Path(__file__).parent
    paths = [str(Path(chute.__file__).parent.parent), str(here), str(here.parent)]
    script = textwrap.dedent(
        STALLED_EXIT.format(paths=paths, name=factory.name, root=str(tmp_path), dump_s=PROMPT_S - 5)
    )
    proc = subprocess.Popen(
        [sys.executable, "-u", "-c", script],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=CHILD_ENV,
    )
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline()  # what came before: opening, under load
        assert line.strip() == "exiting", proc.stderr.read() if proc.stderr else ""
        # Its exit must not wait for the stalled reads (they hold for as
        # long as the server does).
        out, err = proc.communicate(timeout=PROMPT_S)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert proc.returncode == 0, err[-8000:]
    assert "terminate called" not in err and "Traceback" not in err, err[-2000:]
    assert "ran on at exit" not in err, err[-2000:]


DAEMON_EXIT = """
import os, pathlib, sys, threading, time
sys.path[:0] = {paths!r}
import factories
factory = next(f for f in factories.all_factories() if f.name == {name!r})
setting = factory.adapt(factories.Setting(threads=2, batch=2))
data = factory.write(pathlib.Path({root!r}), setting.shards)
loader = factory.loader(data, setting)
first = threading.Event()
def consume():
    while True:
        for batch in loader:
            first.set()
threading.Thread(target=consume, daemon=True).start()
first.wait()
time.sleep({delay})  # the thread is inside chute's next() when the interpreter exits
print("exiting", flush=True)
"""
# An abort at exit depends on where the thread is when exit begins (an
# epoch's start or end is where torch's ops let the GIL go): each kind runs
# this many times (all at once); CHUTE_CONFORMANCE_EXIT_RUNS raises it.
EXIT_RUNS = int(os.environ.get("CHUTE_CONFORMANCE_EXIT_RUNS", "2"))


@pytest.fixture(scope="module")
def daemon_exits(tmp_path_factory: pytest.TempPathFactory) -> dict[str, list[tuple[int, str, str]]]:
    """Every kind's exit runs, started all at once: (status, stdout, stderr)
    of each, by kind."""
    import chute

    root = tmp_path_factory.mktemp("exits")
    here = Path(__file__).parent
    paths = [str(Path(chute.__file__).parent.parent), str(here), str(here.parent)]
    running: dict[str, list[subprocess.Popen[str]]] = {}
    for f in all_factories():
        running[f.name] = [
            subprocess.Popen(
                [
                    sys.executable,
                    "-c",
                    textwrap.dedent(
                        DAEMON_EXIT.format(
                            paths=paths,
                            name=f.name,
                            root=str(root / f.name / str(run)),
                            delay=(0.05, 0.3, 0.45, 0.15, 0.6)[run % 5],
                        )
                    ),
                ],
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
                env=CHILD_ENV,
            )
            for run in range(EXIT_RUNS)
        ]
    done: dict[str, list[tuple[int, str, str]]] = {}
    for name, procs in running.items():
        done[name] = []
        for proc in procs:
            out, err = proc.communicate(timeout=600)
            done[name].append((proc.returncode, out, err))
    return done


@pytest.mark.slow
@pytest.mark.parametrize("factory", cases())
def test_interpreter_exit_with_a_daemon_thread_iterating(factory: Factory, daemon_exits) -> None:
    for status, out, err in daemon_exits[factory.name]:
        assert status == 0, err[-8000:]
        assert out.strip() == "exiting"
        assert "terminate called" not in err and "Traceback" not in err, err[-2000:]
