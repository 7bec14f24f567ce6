"""scripts/ensure_rabbitmq.py: the suite's broker, the machine's or a throwaway node it starts and stops."""

from __future__ import annotations

import asyncio
import os
import re
import socket
import subprocess
import sys
from pathlib import Path
from subprocess import CompletedProcess

import aio_pika
import pytest

ENSURE = Path(__file__).resolve().parents[2] / "scripts" / "ensure_rabbitmq.py"


def _ensure(*args: str, default: str | None = None, env: dict[str, str] | None = None) -> CompletedProcess[str]:
    """Run the script as test.sh does (its own process, so that a broker it starts outlives it), without
    $CONVEYOR_TEST_AMQP_URL unless given."""
    environ = {k: v for k, v in os.environ.items() if k != "CONVEYOR_TEST_AMQP_URL"} | (env or {})
    if default is None:
        command = [sys.executable, str(ENSURE), *args]
    else:
        command = [sys.executable, "-c", f"import ensure_rabbitmq as e; e.main({list(args)!r}, default={default!r})"]
    return subprocess.run(
        command, cwd=ENSURE.parent, env=environ, capture_output=True, text=True, timeout=90, check=False
    )


def _round_trip(url: str) -> bytes:
    """Publish a message through the broker at ``url`` and read it back."""

    async def go() -> bytes:
        connection = await aio_pika.connect(url, timeout=5)
        async with connection:
            channel = await connection.channel()
            queue = await channel.declare_queue("", exclusive=True)
            await channel.default_exchange.publish(aio_pika.Message(b"hello"), queue.name)
            message = await queue.get(timeout=5)
            await message.ack()
            return message.body

    return asyncio.run(go())


def _answers(url: str) -> bool:
    try:
        _round_trip(url)
        return True
    except Exception:
        return False


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.mark.timeout(120)
@pytest.mark.parametrize("how", ["nothing answers", "--throwaway"])
def test_a_throwaway_broker_starts_on_free_ports_answers_and_stop_removes_it(amqp_url: str, how: str) -> None:
    """Where nothing answers at the default URL (a closed port here), or asked to, it starts a node of its own
    (its own name, data, logs, config and ports) and prints its URL and directory; `stop` ends it."""
    if how == "--throwaway":
        started = _ensure("--throwaway")
    else:
        started = _ensure(default=f"amqp://guest:guest@127.0.0.1:{_closed_port()}/")
    assert started.returncode == 0, started.stderr
    url, directory = started.stdout.split()
    try:
        assert re.fullmatch(r"amqp://guest:guest@127\.0\.0\.1:\d+/", url)
        assert url != amqp_url
        assert Path(directory).name.startswith("conveyor-rabbitmq-")
        assert _round_trip(url) == b"hello"
    finally:
        stopped = _ensure("stop", directory)
    assert stopped.returncode == 0, stopped.stderr
    assert not Path(directory).exists()
    assert not _answers(url)
    assert _answers(amqp_url)  # the suite's own broker was left alone


def test_the_default_broker_is_taken_when_it_answers(amqp_url: str) -> None:
    found = _ensure(default=amqp_url)
    assert (found.returncode, found.stdout) == (0, f"{amqp_url} -\n"), found.stderr


def test_the_configured_url_is_used_and_one_that_does_not_answer_fails_in_one_line(amqp_url: str) -> None:
    configured = _ensure(env={"CONVEYOR_TEST_AMQP_URL": amqp_url})
    assert (configured.returncode, configured.stdout) == (0, f"{amqp_url} -\n"), configured.stderr
    failed = _ensure(env={"CONVEYOR_TEST_AMQP_URL": "amqp://guest:hunter2@127.0.0.1:1/"})
    assert failed.returncode != 0 and failed.stdout == ""
    assert failed.stderr.count("\n") == 1 and "CONVEYOR_TEST_AMQP_URL" in failed.stderr
    assert "hunter2" not in failed.stderr


def test_stop_deletes_only_a_directory_it_made(tmp_path: Path) -> None:
    refused = _ensure("stop", str(tmp_path))
    assert refused.returncode != 0 and "not a directory of ensure_rabbitmq.py" in refused.stderr
    assert tmp_path.exists()
