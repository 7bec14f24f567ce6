"""Print a RabbitMQ URL for the test suite, starting a throwaway broker when none is reachable.

Order: $CONVEYOR_TEST_AMQP_URL (must answer), else amqp://guest:guest@127.0.0.1:5672/ if it answers, else a new
broker node in a temporary directory on free ports of 127.0.0.1 (installing Debian's rabbitmq-server package
first when no server binaries exist and we are root). Prints ``URL DIR`` (DIR ``-`` when nothing was started) so
the caller can stop the broker with ``ensure_rabbitmq.py stop DIR``. ``--throwaway`` starts one even where a
broker answers (the test of this script). ``stop --keep DIR`` stops a node keeping its directory, and ``start DIR``
starts it again on the same ports with the same data (a broker restart, for the relay's fault tests)."""

from __future__ import annotations

import asyncio
import json
import logging
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import aio_pika

DEFAULT = "amqp://guest:guest@127.0.0.1:5672/"
# Every directory this script makes starts so; `stop` refuses any other directory, as it deletes what it is given.
PREFIX = "conveyor-rabbitmq-"
PID_FILE = "rabbitmq.pid"
# The node's environment (ports, paths), saved in its directory so that `start DIR` runs the same node again.
SETTINGS_FILE = "node.json"
# The server script that runs the node as the calling user (Debian's /usr/sbin/rabbitmq-server switches to the
# rabbitmq user, whose home and cookie are the machine's broker's).
SERVER_PATHS = ("/usr/lib/rabbitmq/bin/rabbitmq-server", "/usr/local/lib/rabbitmq/bin/rabbitmq-server")
START_TIMEOUT = 60.0
# aiormq logs each refused connection attempt; a broker that is not up yet is what this script checks for.
logging.getLogger("aiormq").setLevel(logging.CRITICAL)
logging.getLogger("aio_pika").setLevel(logging.CRITICAL)


def answers(url: str, timeout: float = 3.0) -> bool:
    """Whether a broker accepts an AMQP connection (log-in included) at ``url``."""

    async def connect() -> None:
        connection = await aio_pika.connect(url, timeout=timeout)
        await connection.close()

    try:
        asyncio.run(asyncio.wait_for(connect(), timeout + 1))
        return True
    except Exception:
        return False


def server_binary() -> str | None:
    for path in SERVER_PATHS:
        if os.access(path, os.X_OK):
            return path
    return None


def install_rabbitmq() -> None:
    subprocess.run(["apt-get", "update", "-qq"], check=True)
    subprocess.run(
        ["apt-get", "install", "-y", "-qq", "rabbitmq-server"],
        check=True,
        env={**os.environ, "DEBIAN_FRONTEND": "noninteractive"},
    )


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def start_server() -> tuple[str, str]:
    """Start a broker node of its own (its data, logs, config, cookie in a new directory); return its URL and
    the directory."""
    server = server_binary()
    if server is None and os.geteuid() == 0 and shutil.which("apt-get"):
        install_rabbitmq()
        server = server_binary()
    if server is None:
        sys.exit(
            "no RabbitMQ reachable and no rabbitmq-server found: install rabbitmq-server or set CONVEYOR_TEST_AMQP_URL"
        )
    base = Path(tempfile.mkdtemp(prefix=PREFIX))
    port, dist_port = free_port(), free_port()
    config = base / "rabbitmq.conf"
    config.write_text(f"listeners.tcp.default = 127.0.0.1:{port}\n")
    # No plugins (the machine's list may enable the management UI on a port that is taken), no env file (the
    # machine's names its node).
    (base / "enabled_plugins").write_text("[].\n")
    (base / "rabbitmq-env.conf").write_text("")
    settings = {
        "HOME": str(base),  # the Erlang cookie is written here, not into the caller's home
        "RABBITMQ_NODENAME": f"conveyor-test-{port}@localhost",
        "RABBITMQ_NODE_IP_ADDRESS": "127.0.0.1",
        "RABBITMQ_NODE_PORT": str(port),
        "RABBITMQ_DIST_PORT": str(dist_port),
        "RABBITMQ_MNESIA_BASE": str(base / "mnesia"),
        "RABBITMQ_LOG_BASE": str(base / "log"),
        "RABBITMQ_CONFIG_FILE": str(config),
        "RABBITMQ_ENABLED_PLUGINS_FILE": str(base / "enabled_plugins"),
        "RABBITMQ_CONF_ENV_FILE": str(base / "rabbitmq-env.conf"),
        "RABBITMQ_PID_FILE": str(base / PID_FILE),
        "ERL_EPMD_ADDRESS": "127.0.0.1",
    }
    (base / SETTINGS_FILE).write_text(json.dumps({"port": port, "env": settings}))
    return run_node(server, base)


def run_node(server: str, base: Path) -> tuple[str, str]:
    """Start the node whose settings are saved in ``base`` and wait until it answers; return its URL and ``base``."""
    saved = json.loads((base / SETTINGS_FILE).read_text())
    # Detached, with no inherited stdout: the caller reads this script's output with $(...), which would
    # otherwise wait for the broker to exit.
    with open(base / "server.log", "a") as log:
        process = subprocess.Popen(
            [server],
            cwd=base,
            env={**os.environ, **saved["env"]},
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    url = f"amqp://guest:guest@127.0.0.1:{saved['port']}/"
    deadline = time.monotonic() + START_TIMEOUT
    while time.monotonic() < deadline and process.poll() is None:
        if answers(url, timeout=1.0):
            return url, str(base)
        time.sleep(0.5)
    if process.poll() is None:
        process.kill()
    sys.exit(f"the throwaway RabbitMQ in {base} did not start; see {base}/server.log and {base}/log")


def server_pid(base: Path) -> int | None:
    """The pid of the node running on ``base``, or None: a stale pid file's number may be another process's by
    now, so the process must have been started with this directory."""
    try:
        pid = int((base / PID_FILE).read_text().strip())
        command = Path(f"/proc/{pid}/cmdline").read_bytes()
    except (OSError, ValueError):
        return None
    return pid if str(base).encode() in command else None


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    return state != "Z"  # a zombie has exited (a container's init may never reap it)


def _own(directory: str) -> Path:
    base = Path(directory)
    if not base.name.startswith(PREFIX):
        sys.exit(f"not a directory of ensure_rabbitmq.py (its name starts with {PREFIX}): {directory}")
    return base


def start(directory: str) -> tuple[str, str]:
    """Start again a node stopped with ``stop --keep`` (same ports, same data); return its URL and directory."""
    base = _own(directory)
    server = server_binary()
    if server is None or not (base / SETTINGS_FILE).is_file():
        sys.exit(f"cannot start the node of {directory}: no rabbitmq-server, or not a node's directory")
    if server_pid(base) is not None:
        sys.exit(f"the node of {directory} is running")
    return run_node(server, base)


def stop(directory: str, keep: bool = False) -> None:
    """Stop a broker started by this script and delete its directory (``keep``: leave it, for ``start``)."""
    base = _own(directory)
    pid = server_pid(base)
    if pid is not None:
        os.kill(pid, signal.SIGTERM)
        deadline = time.monotonic() + 30
        while _alive(pid) and time.monotonic() < deadline:
            time.sleep(0.1)
        if _alive(pid):
            os.kill(pid, signal.SIGKILL)
    if not keep:
        shutil.rmtree(base, ignore_errors=True)


def main(argv: list[str] | None = None, default: str = DEFAULT) -> None:
    """``ensure_rabbitmq.py [--throwaway]`` prints ``URL DIR``; ``ensure_rabbitmq.py stop DIR`` stops that broker.

    ``default`` is the broker tried when $CONVEYOR_TEST_AMQP_URL is unset."""
    args = sys.argv[1:] if argv is None else argv
    if args[:1] == ["stop"] and len(args) in (2, 3) and (len(args) == 2 or args[1] == "--keep"):
        stop(args[-1], keep=len(args) == 3)
        return
    if args[:1] == ["start"] and len(args) == 2:
        print(*start(args[1]))
        return
    if args not in ([], ["--throwaway"]):
        sys.exit("usage: ensure_rabbitmq.py [--throwaway | stop [--keep] DIR | start DIR]")
    if args == ["--throwaway"]:
        url, base = start_server()
        print(url, base)
        return
    configured = os.environ.get("CONVEYOR_TEST_AMQP_URL")
    if configured:
        if not answers(configured):
            sys.exit("CONVEYOR_TEST_AMQP_URL does not answer (an AMQP connection to it failed)")
        print(configured, "-")
    elif answers(default):
        print(default, "-")
    else:
        url, base = start_server()
        print(url, base)


if __name__ == "__main__":
    main()
