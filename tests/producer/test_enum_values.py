"""Names, keys and numbers given as Enum members (or other str/int subclasses) are their values
everywhere: stored, listed, and matched by workers. On Python 3.11 a (str, Enum) member's str() and
format() are 'Queue.EMAILS', which no worker polls."""

from __future__ import annotations

from collections.abc import Iterator
from enum import Enum

import pytest

from conveyor import App, Message
from conveyor.testing import drain


class Name(str, Enum):  # noqa: UP042 - not StrEnum: a plain (str, Enum) formats as 'Name.EMAILS'
    EMAILS = "emails"
    SEND = "mail.send"
    KEY = "customer-7"


class Level(int, Enum):
    HIGH = 7
    TRIES = 4


@pytest.fixture
def app(database_url: str) -> Iterator[App]:
    a = App(database_url, migrate=True)
    yield a
    a.close()


@pytest.mark.parametrize("n", [1, 100])  # the INSERT statement and, on PostgreSQL, the COPY
def test_enum_names_and_keys_are_stored_as_their_values(app: App, n: int) -> None:
    ran: list[int] = []

    @app.task(name=Name.SEND, queue=Name.EMAILS, priority=Level.HIGH, max_attempts=Level.TRIES)
    def send(i: int) -> None:
        ran.append(i)

    options = send.options
    assert (type(options.queue), type(options.priority), type(options.max_attempts)) == (str, int, int)
    jobs = app.send_many(
        [Message(task=Name.SEND, payload={"i": i}, queue=Name.EMAILS, ordering_key=Name.KEY) for i in range(n)]
    )
    [keyed] = app.send_many([Message(task=Name.SEND, payload={"i": n}, idempotency_key=Name.KEY)])
    jobs += [*send.delay_many([{"i": i} for i in range(n + 1, 2 * n + 1)]), keyed]

    for job in jobs:
        status = job.status()
        assert (status.queue, status.task, status.priority) == ("emails", "mail.send", 7)
        assert type(status.queue) is str and status.max_attempts == 4
    assert {q.queue for q in app.admin.queues()} == {"emails"}
    assert app.job(jobs[0].id).ordering_key == "customer-7"
    assert app.job(keyed.id).idempotency_key == "customer-7"
    # A worker on the queue's real name runs them all.
    drain(app, queues=["emails"])
    assert sorted(ran) == list(range(2 * n + 1))
