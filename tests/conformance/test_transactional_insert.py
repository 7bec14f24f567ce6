"""Enqueueing on the caller's own connection: the job commits or rolls back with the caller."""

from __future__ import annotations

import sqlite3
from collections.abc import Iterator
from contextlib import closing, contextmanager
from typing import Any

import psycopg
import pymysql
import pytest
from _factory import T0, acquire, at, insert, live_ids, new_job

from conveyor import ConfigurationError
from conveyor.backends.base import Backend, JobsInsertParams, NewJob, ProcessedKeyClaimParams
from conveyor.backends.mysql._url import connect_kwargs


@contextmanager
def _own_connection(backend: Backend, database_url: str) -> Iterator[Any]:
    """A connection of the application's own, on the backend's database, of the engine's driver."""
    if backend.engine == "sqlite":
        with closing(sqlite3.connect(database_url.removeprefix("sqlite:///"))) as conn:
            yield conn
    elif backend.engine == "mysql":
        with closing(pymysql.connect(**connect_kwargs(database_url))) as conn:
            yield conn
    else:
        with psycopg.connect(database_url) as conn:
            yield conn


def _insert_on(conn: Any, backend: Backend, job: NewJob) -> list[Any]:
    return backend.jobs_insert_many(JobsInsertParams(jobs=[job], now=T0, conn=conn))


def test_a_rolled_back_transaction_enqueues_nothing(backend: Backend, database_url: str) -> None:
    job = new_job("outbox")
    with _own_connection(backend, database_url) as conn:
        assert _insert_on(conn, backend, job) == [job.id]
        conn.rollback()

    assert live_ids(backend, queue="outbox") == []


def test_a_committed_transaction_enqueues_and_is_invisible_before_commit(backend: Backend, database_url: str) -> None:
    job = new_job("outbox")
    with _own_connection(backend, database_url) as conn:
        assert _insert_on(conn, backend, job) == [job.id]
        # Not committed yet: nobody else sees the job. (Read, not acquire: on SQLite the
        # caller's open write transaction holds the file's write lock until it commits.)
        assert live_ids(backend, queue="outbox") == []
        conn.commit()

    assert [d.id for d in acquire(backend, queue="outbox")] == [job.id]


def test_dedup_applies_on_the_callers_connection(backend: Backend, database_url: str) -> None:
    held = new_job("outbox", idempotency_key="k", dedup_until=at(3600))
    insert(backend, held)
    duplicate = new_job("outbox", idempotency_key="k", dedup_until=at(3600))
    with _own_connection(backend, database_url) as conn:
        assert _insert_on(conn, backend, duplicate) == [held.id]
        conn.commit()

    assert live_ids(backend, queue="outbox") == [held.id]


def test_a_conn_of_the_wrong_kind_is_a_configuration_error(backend: Backend) -> None:
    # Every engine refuses the same way, before writing anything: a psycopg connection handed to
    # SQLite (or the reverse) is a mistake in the caller's set-up, not a database failure. The
    # in-memory engine refuses any conn: there is no transaction of the caller's to join.
    with pytest.raises(ConfigurationError, match="conn"):
        _insert_on(object(), backend, new_job("outbox"))
    with pytest.raises(ConfigurationError, match="conn"):
        backend.processed_keys_claim(ProcessedKeyClaimParams("k", at(60), T0, conn=object()))
    if backend.engine != "memory":  # the other engine's connection is named with its module
        other = (
            sqlite3.connect(":memory:")
            if backend.engine == "postgres"
            else psycopg.Connection.__new__(psycopg.Connection)
        )
        with pytest.raises(ConfigurationError, match=r"not (sqlite3|psycopg)\.Connection"):
            _insert_on(other, backend, new_job("outbox"))
    assert live_ids(backend, queue="outbox") == []
