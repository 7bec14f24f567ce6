"""The statement deadline's watch: a call past its deadline has its socket shut down (the thread waiting
on it wakes to an end of file), a call that ended in time is never touched, and a deadline must be a
sensible number of seconds."""

from __future__ import annotations

import math
import socket
import time

import pytest

from conveyor._errors import ConfigurationError
from conveyor.backends import _deadline


def test_a_call_past_its_deadline_wakes_to_an_end_of_file() -> None:
    ours, peer = socket.socketpair()
    with ours, peer:
        watch = _deadline.watch(ours.fileno(), 1.0)
        started = time.monotonic()
        assert ours.recv(10) == b""  # the peer never writes: only the cut ends this wait
        waited = time.monotonic() - started
        assert _deadline.done(watch) is True
        assert 0.9 <= waited < 5, waited


def test_a_call_that_ended_in_time_is_never_cut() -> None:
    ours, peer = socket.socketpair()
    with ours, peer:
        watch = _deadline.watch(ours.fileno(), 1.0)
        assert _deadline.done(watch) is False
        time.sleep(1.6)  # past the deadline it had
        peer.sendall(b"still here")
        assert ours.recv(10) == b"still here"
        assert _deadline.done(watch) is False


def test_no_deadline_watches_nothing() -> None:
    assert _deadline.watch(0, None) is None
    assert _deadline.done(None) is False


@pytest.mark.parametrize(
    "seconds", [0, 0.5, -1, math.nan, math.inf, "60", True, 10**400, pytest.param(10**5000, id="10**5000")]
)
def test_a_deadline_that_is_not_a_sensible_number_of_seconds_is_refused(seconds: object) -> None:
    with pytest.raises(ConfigurationError, match="statement_deadline"):
        _deadline.check_seconds(seconds)  # type: ignore[arg-type]


def test_a_deadline_is_taken_as_float_seconds() -> None:
    assert _deadline.check_seconds(None) is None
    assert _deadline.check_seconds(2) == 2.0


def test_a_socket_that_took_a_closed_ones_number_is_not_cut() -> None:
    """A driver closes its socket on a lost connection before its call stops watching it (libpq, PyMySQL), and
    another thread's new connection may take the same number meanwhile: the deadline is not that one's."""
    ours, peer = socket.socketpair()
    watch = _deadline.watch(ours.fileno(), 1.0)
    ours.close()
    peer.close()
    other, other_peer = socket.socketpair()  # the lowest free numbers: ours and its peer's
    with other, other_peer:
        assert watch.fd in (other.fileno(), other_peer.fileno())
        time.sleep(1.6)  # past the deadline the closed socket had
        _deadline.done(watch)
        other_peer.sendall(b"still here")
        # Before: an end of file (and a broken pipe the other way), the other connection cut.
        assert other.recv(10) == b"still here"
        other.sendall(b"and here")
        assert other_peer.recv(10) == b"and here"


def test_a_call_made_while_the_watch_thread_sleeps_is_cut_too(monkeypatch: pytest.MonkeyPatch) -> None:
    # The thread sleeps once no call was under way for _SLEEP_AFTER, and is woken by the next call only.
    monkeypatch.setattr(_deadline, "_SLEEP_AFTER", 0.3)
    ours, peer = socket.socketpair()
    with ours, peer:
        _deadline.done(_deadline.watch(ours.fileno(), 1.0))  # the thread runs
        time.sleep(1.0)
        assert _deadline._watcher._asleep
        watch = _deadline.watch(ours.fileno(), 1.0)
        started = time.monotonic()
        assert ours.recv(10) == b""
        assert 0.9 <= time.monotonic() - started < 5
        assert _deadline.done(watch) is True
