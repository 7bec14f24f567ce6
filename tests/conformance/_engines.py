"""Four engines side by side for the property tests: one database per engine for a whole test,
emptied between Hypothesis examples, and what an engine answers turned into a form that can be
compared with what the other engines answer.

Normalisation (the only differences between engines that are not drifts):

- receipts are random per engine: a delivery is named by its hand-out number (``#n``), each engine
  keeping its own receipt for ``#n``;
- JSON text (payloads, headers, results, filters, schedule payloads, audit details) is compared
  parsed, since PostgreSQL stores jsonb and hands back its own spelling of the same document;
- ``oldest_pending_age`` is a float computed from two times: it is rounded to the microsecond that
  every time on the seam has;
- the ``job_ids`` of an audit row are compared as a set (the contract names them, not their order).
"""

from __future__ import annotations

import json
import os
import sqlite3
import uuid
from collections.abc import Iterator
from contextlib import closing, contextmanager
from dataclasses import asdict, dataclass, field
from decimal import Decimal
from typing import Any, TypeVar

import psycopg
import pymysql
from psycopg import sql

from conveyor.backends import open_backend
from conveyor.backends.base import (
    ArchiveReadParams,
    AuditEntry,
    AuditListParams,
    Backend,
    DeadListParams,
    Delivery,
    JobRecord,
    JobsListParams,
    QueuesStatsParams,
    QueueStats,
    Schedule,
    Subscription,
    SubscriptionsListParams,
)
from conveyor.backends.mysql._url import connect_kwargs
from conveyor.backends.sqlite import MemoryBackend

ENGINES = ("memory", "sqlite", "postgres", "mysql")

#: Every table a test writes to; emptied between examples.
_TABLES = (
    "jobs",
    "archive",
    "idempotency_keys",
    "processed_keys",
    "audit",
    "schedules",
    "subscriptions",
    "queue_counters",
    "workers",
    "alerts",
)

_T = TypeVar("_T")

#: A whole table, read at once (the property tests keep tables far smaller than this).
_ALL = 100_000


def _with_db(url: str, dbname: str) -> str:
    base, _, _ = url.rpartition("/")
    return f"{base}/{dbname}"


@dataclass
class Engines:
    """A migrated backend per engine. ``reset()`` empties them for the next example."""

    sqlite_path: str
    postgres_url: str
    mysql_url: str
    backends: dict[str, Backend] = field(default_factory=dict)

    def open(self) -> None:
        self.backends["memory"] = MemoryBackend()
        urls = (("sqlite", f"sqlite:///{self.sqlite_path}"), ("postgres", self.postgres_url), ("mysql", self.mysql_url))
        for name, url in urls:
            backend = open_backend(url)
            backend.migrate()
            self.backends[name] = backend

    def reset(self) -> dict[str, Backend]:
        """Empty every table of every engine (a new in-memory database; DELETE on the SQLite file;
        TRUNCATE on PostgreSQL and MySQL, identities restarted so audit ids start at 1 everywhere)."""
        self.backends["memory"].close()
        self.backends["memory"] = MemoryBackend()
        conn = sqlite3.connect(self.sqlite_path, isolation_level=None)
        try:
            conn.execute("BEGIN IMMEDIATE")
            for table in _TABLES:
                conn.execute(f"DELETE FROM {table}")
            conn.execute("DELETE FROM sqlite_sequence")
            conn.execute("COMMIT")
        finally:
            conn.close()
        with psycopg.connect(self.postgres_url, autocommit=True) as pg:
            pg.execute(f"TRUNCATE {', '.join(_TABLES)} RESTART IDENTITY")
        with closing(_mysql(self.mysql_url)) as my, my.cursor() as cur:
            for table in _TABLES:
                cur.execute(f"TRUNCATE {table}")  # an AUTO_INCREMENT starts again at 1
        return {name: self.backends[name] for name in ENGINES}

    def close(self) -> None:
        for backend in self.backends.values():
            backend.close()


@contextmanager
def open_engines(directory: str, server_url: str, mysql_server_url: str) -> Iterator[Engines]:
    """The four engines for one test: a SQLite file in ``directory``, a PostgreSQL database created on
    ``server_url`` and a MySQL database on ``mysql_server_url`` for this test, dropped after it."""
    name = f"conveyor_p_{uuid.uuid4().hex[:12]}"
    with psycopg.connect(server_url, autocommit=True) as conn:
        conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
    with closing(_mysql(mysql_server_url)) as my, my.cursor() as cur:
        cur.execute(f"CREATE DATABASE `{name}` CHARACTER SET utf8mb4 COLLATE utf8mb4_nopad_bin")
    engines = Engines(
        sqlite_path=os.path.join(directory, "conveyor.db"),
        postgres_url=_with_db(server_url, name),
        mysql_url=_with_db(mysql_server_url, name),
    )
    try:
        engines.open()
        yield engines
    finally:
        engines.close()
        with psycopg.connect(server_url, autocommit=True) as conn:
            conn.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name)))
        with closing(_mysql(mysql_server_url)) as my, my.cursor() as cur:
            cur.execute(f"DROP DATABASE IF EXISTS `{name}`")


def _mysql(url: str) -> Any:
    """An autocommit PyMySQL connection to ``url``."""
    return pymysql.connect(**connect_kwargs(url), autocommit=True)


# --------------------------------------------------------------------------------------------
# Normal forms
# --------------------------------------------------------------------------------------------


def parse_json(text: str) -> Any:
    """JSON text as a value, numbers as ``Decimal``: jsonb spells a number its own way (1e+16 as
    10000000000000000), and a float parsed from the two spellings need not be the same float."""
    return json.loads(text, parse_float=Decimal, parse_int=Decimal)


def _json(text: str | None) -> Any:
    return None if text is None else parse_json(text)


def record(r: JobRecord) -> dict[str, Any]:
    """A job record with its JSON text parsed."""
    out = asdict(r)
    for key in ("payload", "headers", "result"):
        out[key] = _json(out[key])
    return out


def delivery(d: Delivery, number: int) -> dict[str, Any]:
    """A delivery with its receipt replaced by its hand-out number."""
    out = asdict(d)
    out["receipt"] = f"#{number}"
    for key in ("payload", "headers"):
        out[key] = _json(out[key])
    return out


def stats(s: QueueStats) -> dict[str, Any]:
    out = asdict(s)
    if out["oldest_pending_age"] is not None:
        out["oldest_pending_age"] = round(out["oldest_pending_age"], 6)
    return out


def audit(e: AuditEntry) -> dict[str, Any]:
    out = asdict(e)
    out["job_ids"] = sorted(e.job_ids)
    # The contract leaves the details document to the engine (and the engines do word it
    # differently: see the module docstring); it must be a JSON object.
    details = _json(e.details)
    assert isinstance(details, dict), e
    out["details"] = "a JSON object"
    return out


def schedule(s: Schedule) -> dict[str, Any]:
    out = asdict(s)
    out["payload"] = _json(s.payload)
    return out


def subscription(s: Subscription) -> dict[str, Any]:
    out = asdict(s)
    out["filter"] = _json(s.filter)
    return out


@dataclass(frozen=True)
class Snapshot:
    """Everything an engine holds, as the seam reads it, in normal form."""

    live: list[dict[str, Any]]
    archived: list[dict[str, Any]]
    stats: list[dict[str, Any]]
    dead: list[dict[str, Any]]
    audit: list[dict[str, Any]]
    schedules: list[dict[str, Any]]
    subscriptions: list[dict[str, Any]]

    def jobs(self) -> dict[uuid.UUID, dict[str, Any]]:
        """Every job by id, live or archived."""
        return {r["id"]: r for r in [*self.live, *self.archived]}


def snapshot(backend: Backend, now: Any) -> Snapshot:
    return Snapshot(
        live=[record(r) for r in backend.jobs_list(JobsListParams(limit=_ALL))],
        archived=[record(r) for r in backend.archive_read(ArchiveReadParams(after=None, limit=_ALL))],
        stats=[stats(s) for s in backend.queues_stats(QueuesStatsParams(now=now))],
        dead=[record(r) for r in backend.dead_list(DeadListParams(limit=_ALL))],
        audit=[audit(e) for e in backend.audit_list(AuditListParams(limit=_ALL))],
        schedules=[schedule(s) for s in backend.schedules_list()],
        subscriptions=[subscription(s) for s in backend.subscriptions_list(SubscriptionsListParams())],
    )


# --------------------------------------------------------------------------------------------
# Agreement
# --------------------------------------------------------------------------------------------


def _describe(value: Any, other: Any, depth: int = 0) -> list[str]:
    """Where ``value`` differs from ``other``, as short lines (records are matched by id)."""
    if isinstance(value, Snapshot) and isinstance(other, Snapshot):
        lines = []
        for name in value.__dataclass_fields__:
            for line in _describe(getattr(value, name), getattr(other, name), depth + 1):
                lines.append(f"{name}: {line}")
        return lines
    records = isinstance(value, list) and isinstance(other, list)
    if records and all(isinstance(v, dict) and "id" in v for v in [*value, *other]):
        mine = {v["id"]: v for v in value}
        theirs = {v["id"]: v for v in other}
        lines = []
        for key in sorted(set(mine) | set(theirs)):
            if key not in mine or key not in theirs:
                lines.append(f"{key}: only on {'this engine' if key in mine else 'the reference'}")
            elif mine[key] != theirs[key]:
                lines.extend(f"{key}: {line}" for line in _describe(mine[key], theirs[key], depth + 1))
        if not lines and [v["id"] for v in value] != [v["id"] for v in other]:
            lines.append(f"order {[v['id'] for v in value]} vs {[v['id'] for v in other]}")
        return lines
    if isinstance(value, dict) and isinstance(other, dict):
        return [
            f"{key}={value.get(key)!r} (reference {other.get(key)!r})"
            for key in sorted(set(value) | set(other), key=str)
            if value.get(key) != other.get(key)
        ]
    return [] if value == other else [f"{value!r} (reference {other!r})"]


def agree(what: str, answers: dict[str, _T]) -> _T:
    """The engines' common answer; fails naming each engine that answered otherwise, and how."""
    reference_name = ENGINES[0]
    reference = answers[reference_name]
    problems = []
    for name, answer in answers.items():
        if answer != reference:
            detail = "\n    ".join(_describe(answer, reference)[:20]) or repr(answer)
            problems.append(f"  {name} differs from {reference_name}:\n    {detail}")
    if problems:
        raise AssertionError(f"engines disagree on {what}:\n" + "\n".join(problems))
    return reference
