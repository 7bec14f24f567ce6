"""The PostgreSQL backend (psycopg 3): SKIP LOCKED acquire, batched outcomes, NOTIFY wake-ups.

What an operator or a caller should know:

- **Schema.** ``migrate()`` applies ``sql/NNNN_*.sql`` in order under an advisory lock (safe when
  many workers start at once) and records them in ``conveyor_schema_migrations``; tables live in
  the connection's default schema. ``jobs`` holds live rows only; ``archive`` is partitioned by
  day on ``finished_at`` (plus a DEFAULT partition for rows no daily partition covers).
- **Partitions.** ``migrate()`` creates the partitions from yesterday to a week ahead; every
  ``archive_prune`` call (the pruner) creates them ahead again, then drops daily partitions whose
  rows are all past retention and deletes the rest row by row. Partition DDL gives up after a
  one-second lock wait rather than stall finishing workers behind a long reader; it is retried on
  the next run.
- **Notifications.** Every statement that makes jobs ready calls ``pg_notify('conveyor_jobs',
  <queue>)`` once per queue; ``listen()`` opens a dedicated connection per listener.
- **Transactional enqueue.** ``jobs_insert_many`` and ``processed_keys_claim`` with ``conn=`` (an
  open sync ``psycopg.Connection`` on the same database) run on that connection and never commit.
- **Errors.** Connection failures, timeouts and server shutdowns raise ``BackendUnavailable``
  (retry with backoff; the pool replaces broken connections); a statement the server cancelled (a
  ``statement_timeout``) raises ``StatementCancelled``, a ``BackendUnavailable`` a batch's caller
  splits; other errors raise ``BackendError``.
- **Durability.** Every statement commits with the server's ``synchronous_commit``; on a busy
  machine the WAL flush of each commit dominates per-call latency, which is why outcomes and
  acquires should be batched.
"""

from __future__ import annotations

from conveyor.backends.postgres._backend import PostgresBackend
from conveyor.backends.postgres._listener import PostgresListener

__all__ = ["PostgresBackend", "PostgresListener"]
