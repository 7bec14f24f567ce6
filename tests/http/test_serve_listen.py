"""`conveyor serve` and its port: a port another service or program listens on, or an address that
is not of this machine, is one line and exit 1, never a second service sharing the port, a traceback
or a process restarted forever."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from pathlib import Path

import httpx
import pytest
from tests.http.conftest import REPO, free_port, start, stop

from conveyor import App


def _serve(db: str, *args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO / "src"), str(REPO)])}
    argv = [sys.executable, "-m", "conveyor", "--db", db, "serve", "--insecure-no-auth", *args]
    # A service that started (the bug) runs until the timeout: TimeoutExpired fails the test.
    return subprocess.run(argv, capture_output=True, text=True, timeout=30, cwd=REPO, env=env)


def _refused(done: subprocess.CompletedProcess[str], reason: str) -> None:
    assert done.returncode == 1, done.stderr
    assert done.stderr.strip().splitlines() == [done.stderr.strip()], done.stderr  # one line
    assert reason in done.stderr and "Traceback" not in done.stderr


def test_a_port_another_service_or_program_listens_on_is_refused(sqlite_url: str, tmp_path: Path) -> None:
    # Before, every process set SO_REUSEPORT: a second service on the port started silently and the
    # kernel split the connections between the two.
    first = start(sqlite_url, tmp_path, "--insecure-no-auth", "--workers", "2", app_path=None)
    try:
        port = first.url.rsplit(":", 1)[1]
        for workers in ("1", "2"):
            _refused(_serve(sqlite_url, "--port", port, "--workers", workers), "address already in use")
        for _ in range(10):  # both processes of the first service still answer every request
            assert httpx.get(f"{first.url}/healthz", timeout=5).status_code == 200
    finally:
        stop(first)
    with socket.socket() as other:
        other.bind(("127.0.0.1", 0))
        other.listen()
        _refused(_serve(sqlite_url, "--port", str(other.getsockname()[1])), "address already in use")


@pytest.mark.parametrize("host", ["256.0.0.1", "192.0.2.1"])
def test_an_address_that_is_not_of_this_machine_is_one_line(sqlite_url: str, host: str) -> None:
    # Before: a 38-line traceback, and with --workers 2 each process failing and restarted forever.
    for workers in ("1", "2"):
        _refused(_serve(sqlite_url, "--host", host, "--port", "8000", "--workers", workers), "cannot listen on")


@pytest.mark.parametrize("host", ["x" * 70, "caf\udce9"], ids=["label-past-63", "not-utf8"])
def test_a_host_no_name_lookup_can_encode_is_one_line(sqlite_url: str, host: str) -> None:
    # Before: a traceback (UnicodeError from the idna codec in getaddrinfo).
    _refused(_serve(sqlite_url, "--host", host, "--port", "0"), "not an address or a host name")


@pytest.mark.parametrize("ips", ["nan", "127.0.0.1,junk", "10.0.0.300"])
def test_forwarded_allow_ips_that_name_no_address_are_refused(sqlite_url: str, ips: str) -> None:
    # Before: the service started, uvicorn took each bad entry as a literal name no TCP peer matches, and no proxy
    # was believed, without a word.
    done = _serve(sqlite_url, "--port", "0", "--forwarded-allow-ips", ips)
    assert done.returncode == 2, done.stderr
    assert done.stderr.strip().splitlines() == [done.stderr.strip()], done.stderr
    assert "is not an IP address or network" in done.stderr and "Traceback" not in done.stderr


@pytest.mark.parametrize("ips", ["127.0.0.1/8", "*, 10.0.0.1"])
def test_forwarded_allow_ips_a_network_with_host_bits_or_a_star_in_a_list_are_believed(
    sqlite_url: str, tmp_path: Path, ips: str
) -> None:
    # Before: uvicorn read 127.0.0.1/8 (host bits set) as a literal name, and "*" only alone: neither trusted the
    # proxy on 127.0.0.1, so its X-Forwarded-For was ignored.
    server = start(sqlite_url, tmp_path, "--insecure-no-auth", "--access-log", "-v", "--forwarded-allow-ips", ips)
    try:
        answer = httpx.get(f"{server.url}/healthz", headers={"X-Forwarded-For": "203.0.113.7"}, timeout=5)
        assert answer.status_code == 200
    finally:
        stop(server)
    assert "203.0.113.7" in server.stderr(), server.stderr()


# A Ctrl-C to the process group right after `conveyor serve --workers 2` started its first process, which is still
# importing. The wrapper stands in for a terminal whose signal lands at that moment.
_CTRL_C_WHILE_STARTING = """
import os, signal, subprocess, sys
from conveyor.cli import main
popen, sent = subprocess.Popen.__init__, []

def init(self, *args, **kwargs):
    popen(self, *args, **kwargs)
    if not sent:
        sent.append(True)
        os.killpg(0, signal.SIGINT)

subprocess.Popen.__init__ = init
sys.exit(main(["--db", sys.argv[1], "serve", "--insecure-no-auth", "--port", sys.argv[2], "--workers", "2"]))
"""


def test_ctrl_c_while_the_service_processes_start_is_one_graceful_stop(sqlite_url: str) -> None:
    """Before: the new process died of a KeyboardInterrupt in its imports (a traceback at the user), and the parent,
    whose handler came only after both starts, died of it too (another traceback), leaving what it had started
    unsupervised. Now: the parent stops what it started, exit 0, and nothing is printed but the banner."""
    App(sqlite_url, migrate=True).close()
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO / "src"), str(REPO)])}
    done = subprocess.run(
        [sys.executable, "-c", _CTRL_C_WHILE_STARTING, sqlite_url, str(free_port())],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=REPO,
        env=env,
        start_new_session=True,
    )
    assert done.returncode == 0, done.stderr
    assert "Traceback" not in done.stderr and "KeyboardInterrupt" not in done.stderr, done.stderr
