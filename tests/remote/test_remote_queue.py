"""The native FetchQueue driven by hand, without a store: what a remote
source asks for, how answers, failures and retries reach its reader, and
that every wait ends (no fetcher at all, a fetcher that never answers)."""

from __future__ import annotations

import threading
import time

import chute
import pytest
from chute import _core

# scripts/sanitize.sh runs the tests marked native under ASan and TSan.
pytestmark = pytest.mark.native

URL = "s3://bucket/key.bin"


def queue(**kw: object) -> _core.FetchQueue:
    settings: dict[str, object] = {"range_bytes": 100, "backoff_s": 0.0, "max_backoff_s": 0.0}
    settings.update(kw)
    return _core.FetchQueue(**settings)  # type: ignore[arg-type]


def pop(q: _core.FetchQueue, limit_s: float = 10.0) -> _core.FetchTicket:
    deadline = time.monotonic() + limit_s
    while time.monotonic() < deadline:
        ticket = q.try_pop()
        if ticket is not None:
            return ticket
        time.sleep(0.005)
    raise AssertionError("no request arrived")


class Reader:
    """A RemoteReader whose read() runs in a thread (it waits for answers)."""

    def __init__(self, q: _core.FetchQueue, n: int = -1) -> None:
        self.reader = _core.RemoteReader(URL, q)
        self.result: bytes | None = None
        self.error: BaseException | None = None
        self.thread = threading.Thread(target=self._run, args=(n,))
        self.thread.start()

    def _run(self, n: int) -> None:
        try:
            self.result = self.reader.read(n)
        except BaseException as e:
            self.error = e

    def join(self) -> None:
        self.thread.join(30)
        assert not self.thread.is_alive()


def test_head_then_ranges_in_order():
    q = queue(max_in_flight=2)
    r = Reader(q)
    head = pop(q)
    assert (head.op, head.url, head.attempt) == ("head", URL, 0)
    head.complete_head(250, '"v1"', '"v1"')
    a, b = pop(q), pop(q)
    assert [(t.op, t.offset, t.length, t.if_match) for t in (a, b)] == [
        ("range", 0, 100, '"v1"'),
        ("range", 100, 100, '"v1"'),
    ]
    assert q.try_pop() is None  # two in flight at most
    b.complete(b"b" * 100)  # out of order: held until the first range is in
    a.complete(b"a" * 100)
    c = pop(q)
    assert (c.offset, c.length) == (200, 50)  # never past the end
    c.complete(memoryview(b"c" * 50))
    r.join()
    assert r.result == b"a" * 100 + b"b" * 100 + b"c" * 50
    assert q.stats()["reserved_bytes"] == 0


def test_short_answer_is_retried_never_delivered():
    q = queue(retries=1)
    r = Reader(q)
    pop(q).complete_head(100, "", "mtime")
    first = pop(q)
    assert first.if_match == ""  # no ETag: no If-Match
    first.complete(b"x" * 60)
    again = pop(q)
    assert (again.offset, again.length, again.attempt) == (0, 100, 1)
    again.complete(b"y" * 60)
    r.join()
    assert isinstance(r.error, chute.ReadError)
    message = str(r.error)
    assert URL in message and "bytes 0-99" in message and "short response: 60 bytes" in message
    assert "gave up after 2 attempts" in message
    assert q.stats()["retries"] == 1


def test_non_retryable_failure_names_the_status():
    q = queue(retries=5)
    r = Reader(q)
    pop(q).fail("io", 404, "no such key", False)
    r.join()
    assert isinstance(r.error, chute.ReadError)
    assert f"cannot read '{URL}': HTTP 404: no such key" in str(r.error)
    assert q.stats()["retries"] == 0 and q.stats()["failures"] == 1


def test_usage_failure_and_an_unknown_kind():
    q = queue()
    r = Reader(q)
    ticket = pop(q)
    with pytest.raises(ValueError, match="unknown failure kind"):
        ticket.fail("bogus", 0, "", False)
    ticket.fail("usage", 0, "unknown configuration key", False)
    r.join()
    assert type(r.error) is ValueError


def test_answers_to_a_closed_reader_are_ignored_and_its_requests_cancelled():
    q = queue(max_in_flight=3)
    reader = _core.RemoteReader(URL, q)
    pop(q).complete_head(1000, "", "v")
    tickets = [pop(q) for _ in range(3)]
    reader.close()
    assert sorted(q.take_cancelled()) == sorted(t.id for t in tickets)
    for t in tickets:
        t.complete(b"z" * 100)  # nobody wants these any more: no effect
    assert q.stats() == {**q.stats(), "in_flight": 0, "queued": 0, "reserved_bytes": 0}


def test_without_a_fetcher_a_read_ends():
    # Nothing ever takes the request: the reader gives up after the longest
    # that all attempts could have taken.
    q = queue(timeout_s=0.2, retries=0)
    reader = _core.RemoteReader(URL, q)
    with pytest.raises(TimeoutError, match="nothing arrived"):
        reader.read()


def test_a_fetcher_that_never_answers_is_timed_out():
    q = queue(timeout_s=0.2, retries=1)
    r = Reader(q)
    first = pop(q)
    second = pop(q)  # the first attempt expired and was retried
    assert (second.op, second.attempt) == ("head", 1)
    assert first.id in q.take_cancelled()
    first.complete_head(5, "", "v")  # too late: ignored
    r.join()
    assert isinstance(r.error, chute.ReadError)
    assert "no answer within 0.2 s" in str(r.error)


def test_closing_the_queue_fails_waiting_readers():
    q = queue()
    r = Reader(q)
    pop(q)
    q.close()
    r.join()
    assert isinstance(r.error, chute.ReadError) and "closed" in str(r.error)
    assert q.try_pop() is None
    with pytest.raises(chute.ReadError, match="closed"):
        _core.RemoteReader(URL, q).read()
