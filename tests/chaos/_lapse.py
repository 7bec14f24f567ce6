"""A worker whose database stops answering for a while (every byte through the proxy lost), run on any
engine: the scenario of tests/postgres/test_pg_deadline.py and tests/mysql/test_mysql_deadline.py."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from urllib.parse import urlsplit, urlunsplit

from conveyor import App
from conveyor.backends.base import Backend
from conveyor.worker import Worker

from ._proxy import TcpProxy


@contextmanager
def through_proxy(url: str, default_port: int) -> Iterator[tuple[TcpProxy, str]]:
    """A proxy in front of ``url``'s server, and ``url`` through it."""
    parts = urlsplit(url)
    with TcpProxy(parts.hostname or "127.0.0.1", parts.port or default_port) as proxy:
        netloc = parts.netloc.rsplit("@", 1)[0] + f"@127.0.0.1:{proxy.port}"
        yield proxy, urlunsplit(parts._replace(netloc=netloc))


def worker_goes_on_after_a_lapse(url: str, backend: Callable[[str], Backend], lapse: float) -> list[int]:
    """Run a worker on ``backend(url through a proxy)``: 5 jobs, then ``lapse`` seconds in which every byte
    is lost (the worker's statements meanwhile never get an answer), then 5 more jobs. The jobs that ran
    (each once, all ten, if the worker went on); fails if the last five did not run within 30 s."""
    with App(url, migrate=True) as setup:
        setup.backend  # noqa: B018 (opening it migrates)
    done: list[int] = []
    with through_proxy(url, 5432 if url.startswith("postgres") else 3306) as (proxy, via):
        app = App(via, backend=backend(via))

        @app.task(queue="q", name="t")
        def t(i: int) -> None:
            done.append(i)

        worker = Worker(app, queues=["q"], concurrency=2, poll_interval=0.2, heartbeat_interval=0.5)
        runner = threading.Thread(target=worker.run_sync, kwargs={"install_signals": False}, daemon=True)
        runner.start()
        try:
            with App(url) as producer:
                send = producer.task(queue="q", name="t")(lambda i: None)
                for i in range(5):
                    send.delay(i=i)
                _wait_for(lambda: len(done) >= 5, "the first jobs")
                proxy.swallowing = True
                time.sleep(lapse)
                proxy.swallowing = False
                for i in range(5, 10):
                    send.delay(i=i)
                _wait_for(lambda: len(done) >= 10, "the jobs sent after the database answered again")
        finally:
            worker.stop()
            runner.join(timeout=30)
            app.close()
        assert not runner.is_alive()
    return done


def _wait_for(condition: Callable[[], bool], what: str, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.05)
