"""Running the service: N uvicorn processes, each with its own listening socket on one port.

uvicorn's own ``--workers`` shares one listening socket between processes, and whichever process
wakes first accepts: under a burst of new connections (64 clients connecting at once) one process
took nearly all of them while the other idled (measured: groups of 29 jobs in one process, 3 in the
other). Here each process has a socket of its own on the port, bound with ``SO_REUSEPORT``, so the
kernel spreads connections evenly across them. The parent binds them all before any process starts
(a port in use or an address not of this machine is then one error, not a process failing and
restarted forever) and hands each process its socket; a restarted process gets the same one. The
parent forwards SIGTERM and SIGINT (each process then stops gracefully: it finishes its requests
and the transactions under way), and restarts a process that died.

``SO_REUSEPORT`` lets any socket of the same user join the port: the parent therefore first binds
it without, so that a port another program or another ``conveyor serve`` listens on is refused
("address already in use") rather than shared with it, the kernel splitting the traffic between two
services. One process needs no ``SO_REUSEPORT`` at all.
"""

from __future__ import annotations

import signal
import socket
import subprocess
import sys
import time
from types import FrameType

from conveyor.http._api import SHUTDOWN_SECONDS
from conveyor.http._factory import from_environment

#: Seconds the interpreter lets a thread hold the GIL while another waits (Python's default is
#: 5 ms). The group commit's insert runs in a worker thread; when its database round trip returns,
#: it waited for the event loop's thread to give the GIL up, up to 5 ms per transaction (measured:
#: a 32-job insert took 1.3 ms alone and 6 ms in the service; 4,300 jobs/s and p99 48 ms with the
#: default, 7,000 jobs/s and p99 25 ms with 0.5 ms, on one process).
SWITCH_INTERVAL = 0.0005

#: Seconds a SIGTERM gives a service process to stop (requests under way, then its own shutdown).
GRACEFUL_SECONDS = 30.0


def _bind(host: str, port: int, reuse_port: bool) -> socket.socket:
    family, kind, proto, _, address = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)[0]
    sock = socket.socket(family, kind, proto)
    try:
        # SO_REUSEADDR only lets the port be bound while old connections to it are in TIME_WAIT
        # (a restart): on Linux it never lets two sockets listen on it.
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        if reuse_port:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
        sock.bind(address)
        sock.listen(2048)
    except BaseException:
        sock.close()
        raise
    return sock


def listen(host: str, port: int, workers: int) -> list[socket.socket]:
    """One listening socket on ``host:port`` per service process. Raises OSError (with nothing left
    bound) for a port in use, by another program or another service, or an address that is not of
    this machine (socket.gaierror: a host name that does not resolve)."""
    if workers == 1 or not hasattr(socket, "SO_REUSEPORT"):
        return [_bind(host, port, reuse_port=False)] * (1 if workers == 1 else workers)
    # Bound without SO_REUSEPORT first: the bind fails while anything listens on the port.
    _bind(host, port, reuse_port=False).close()
    sockets: list[socket.socket] = []
    try:
        for _ in range(workers):
            sockets.append(_bind(host, port, reuse_port=True))
    except BaseException:
        for sock in sockets:
            sock.close()
        raise
    return sockets


def serve_one(sock: socket.socket, log_level: str, access_log: bool, forwarded_allow_ips: str = "") -> None:
    """Run one service process on the listening socket ``sock`` until SIGTERM or SIGINT (reads
    $CONVEYOR_SERVE).

    ``forwarded_allow_ips`` (comma-separated addresses or networks, ``*``: any; empty: none) are the
    proxies whose ``X-Forwarded-Proto`` and ``X-Forwarded-For`` are believed."""
    import uvicorn

    sys.setswitchinterval(SWITCH_INTERVAL)
    config = uvicorn.Config(
        from_environment,
        factory=True,
        log_level=log_level,
        access_log=access_log,
        # Forwarded headers are believed only from the proxies the operator names: anyone else could
        # claim https (a Secure cookie over plain HTTP) or another client address. Behind a TLS-terminating
        # proxy they make the scheme https, which the dashboard's session cookie (Secure) and its forms'
        # Origin check follow.
        proxy_headers=bool(forwarded_allow_ips),
        forwarded_allow_ips=forwarded_allow_ips or None,
        lifespan="on",
        # A stop takes at most 30 s: the wait for requests under way, then the service's own shutdown.
        timeout_graceful_shutdown=int(GRACEFUL_SECONDS - SHUTDOWN_SECONDS),
    )
    uvicorn.Server(config).run(sockets=[sock])


def serve(sockets: list[socket.socket], log_level: str, access_log: bool, forwarded_allow_ips: str = "") -> int:
    """Run one service process per listening socket (:func:`listen`); return the exit code."""
    if len(sockets) == 1:
        serve_one(sockets[0], log_level, access_log, forwarded_allow_ips)
        return 0

    def start(sock: socket.socket) -> subprocess.Popen[bytes]:
        command = [
            sys.executable,
            "-c",
            # SIGINT ignored, then unblocked (see below) before the imports; uvicorn installs its own handler.
            "import signal; signal.signal(signal.SIGINT, signal.SIG_IGN); "
            "signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT}); "
            "import socket, sys; from conveyor.http._serve import serve_one; "
            "serve_one(socket.socket(fileno=int(sys.argv[1])), sys.argv[2], sys.argv[3] == '1', sys.argv[4])",
            str(sock.fileno()),
            log_level,
            "1" if access_log else "0",
            forwarded_allow_ips,
        ]
        # The process starts with SIGINT blocked (Popen keeps the signal mask) and ignores it until uvicorn runs:
        # a Ctrl-C to the process group while it started up ended it with a KeyboardInterrupt traceback from its
        # imports. The SIGTERM this process forwards stops it instead. (Not SIG_IGN here: setting it discards a
        # SIGINT pending for this process, a Ctrl-C then lost.)
        blocked = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT})
        try:
            return subprocess.Popen(command, pass_fds=[sock.fileno()])
        finally:
            signal.pthread_sigmask(signal.SIG_SETMASK, blocked)

    stopping = False
    children: list[subprocess.Popen[bytes]] = []
    stopped: set[int] = set()  # the pids sent their SIGTERM

    def forward(child: subprocess.Popen[bytes]) -> None:
        if stopping and child.pid not in stopped and child.poll() is None:
            stopped.add(child.pid)
            child.send_signal(signal.SIGTERM)

    def stop(signum: int, _frame: FrameType | None) -> None:
        nonlocal stopping
        stopping = True
        for child in children:
            forward(child)
        # No process is started again: new connections are refused rather than queued on a socket
        # that no process will accept from.
        for sock in sockets:
            sock.close()

    def launch(i: int) -> None:
        """Start the process of socket ``i`` (again); one a signal came in while it started is stopped too."""
        child = start(sockets[i])
        if i < len(children):
            children[i] = child
        else:
            children.append(child)
        forward(child)

    # Before the first start: a Ctrl-C while the processes start is a stop (a KeyboardInterrupt here left the
    # started ones running, unsupervised).
    previous = {sig: signal.signal(sig, stop) for sig in (signal.SIGTERM, signal.SIGINT)}
    try:
        for i in range(len(sockets)):
            if not stopping:
                launch(i)
        while True:
            if stopping:
                for child in children:
                    child.wait()
                return 0
            for i, child in enumerate(children):
                if child.poll() is not None and not stopping:
                    print(
                        f"conveyor serve: process {child.pid} exited ({child.returncode}); starting another",
                        file=sys.stderr,
                        flush=True,
                    )
                    time.sleep(1.0)
                    if not stopping:
                        launch(i)
            time.sleep(0.2)
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
        for child in children:
            if child.poll() is None:
                child.kill()
                child.wait()
        for sock in sockets:
            sock.close()
