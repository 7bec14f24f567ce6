"""Settings a database or role may carry (``ALTER DATABASE ... SET``, a URL's ``options``): Conveyor's sessions
hold their own against those that change what it reads back, and honour those it is given."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from datetime import UTC, datetime, timedelta

import psycopg
import pytest
from psycopg import sql

from conveyor import App, BackendError, BackendUnavailable, Message, Worker, _clock
from conveyor.backends.base import JobsAcquireParams, LeaseRef, LeasesExtendParams
from conveyor.backends.postgres import PostgresBackend
from conveyor.worker.fetcher import Fetcher


def _alter(url: str, setting: str, value: str) -> None:
    """``ALTER DATABASE <this one> SET setting = value`` (for the connections opened from now on)."""
    with psycopg.connect(url, autocommit=True) as conn:
        name = conn.info.dbname
        conn.execute(
            sql.SQL("ALTER DATABASE {} SET {} = {}").format(
                sql.Identifier(name), sql.Identifier(setting), sql.Literal(value)
            )
        )


def _drain(app: App) -> Worker:
    worker = Worker(app, burst=True, poll_interval=0.02)
    asyncio.run(asyncio.wait_for(worker.run(), timeout=60))
    return worker


def _drain_meanwhile(app: App, after: float, action: Callable[[], None]) -> Worker:
    """:func:`_drain`, with ``action`` run on a thread ``after`` seconds in (the database made writable again,
    a grant given back)."""
    timer = threading.Timer(after, action)
    timer.start()
    try:
        return _drain(app)
    finally:
        timer.join()


def test_a_database_whose_datestyle_is_not_iso_runs_jobs_and_reads_their_times(postgres_database: str) -> None:
    # Before: psycopg reads times only in ISO style; every acquire took its leases, then failed to read
    # them (NotImplementedError), the worker stopped, and app.job() raised the same.
    _alter(postgres_database, "DateStyle", "SQL, DMY")
    with App(postgres_database, migrate=True) as app:

        @app.task(queue="q")
        def t(i: int) -> int:
            return i

        before = datetime.now(UTC)
        ids = [t.delay(i=i).id for i in range(5)]
        worker = _drain(app)
        assert worker.exit_code == 0
        for i, job_id in enumerate(ids):
            job = app.job(job_id)
            assert (job.state, job.result) == ("completed", i)
            assert job.finished_at is not None
            assert before - timedelta(seconds=5) < job.finished_at < datetime.now(UTC) + timedelta(seconds=5)


def test_a_queues_oldest_age_is_read_in_full_whatever_extra_float_digits(postgres_database: str) -> None:
    # Before: extra_float_digits = -15 rounded the age to one digit (1749.3 s read 2000).
    _alter(postgres_database, "extra_float_digits", "-15")
    with App(postgres_database, migrate=True) as app:
        app.send("t", queue="q")
        with psycopg.connect(postgres_database, autocommit=True) as conn:
            conn.execute("UPDATE jobs SET run_at = run_at - interval '1749.3 seconds'")
        (stats,) = app.admin.queues()
        assert stats.oldest_pending_age is not None
        assert 1749.3 <= stats.oldest_pending_age < 1760, stats.oldest_pending_age


def test_a_search_path_in_the_urls_options_holds_for_every_connection_of_a_worker(postgres_database: str) -> None:
    # Conveyor in a schema of its own, named by the URL (a table called jobs in public, several tenants).
    # Before: the outcome pool and the worker's acquire replaced the URL's options with their own, so
    # the tenant's worker ran public's jobs with the tenant's handlers and never found its own.
    with psycopg.connect(postgres_database, autocommit=True) as conn:
        conn.execute("CREATE SCHEMA tenant_a")
    tenant_url = f"{postgres_database}?options=-c%20search_path%3Dtenant_a"
    ran: list[str] = []
    with App(postgres_database, migrate=True) as public, App(tenant_url, migrate=True) as tenant:

        @tenant.task(queue="q")
        def t(who: str) -> None:
            ran.append(who)

        for _ in range(3):
            public.send(t.name, {"who": "public"}, queue="q")
            tenant.send(t.name, {"who": "tenant"}, queue="q")
        assert _drain(tenant).exit_code == 0
        assert ran == ["tenant"] * 3
        assert [q.pending for q in public.admin.queues()] == [3]
        assert [(q.pending, q.completed) for q in tenant.admin.queues()] == [(0, 3)]


def test_a_worker_whose_database_refuses_its_statements_says_why_in_one_line(
    postgres_database: str, caplog: pytest.LogCaptureFixture
) -> None:
    with App(postgres_database, migrate=True) as app:
        app.send("t", queue="q")
    with psycopg.connect(postgres_database, autocommit=True) as conn:  # a policy of the database's own
        conn.execute(
            "CREATE FUNCTION refuse() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN "
            "RAISE EXCEPTION 'leases are refused by policy'; END $$; "
            "CREATE TRIGGER refuse BEFORE UPDATE ON jobs FOR EACH ROW EXECUTE FUNCTION refuse()"
        )
    with App(postgres_database) as app, caplog.at_level(logging.ERROR, logger="conveyor.worker"):

        @app.task(queue="q")
        def t() -> None:
            pass

        assert _drain(app).exit_code == 1
    failed = [r for r in caplog.records if "failed" in r.getMessage()]
    assert any("worker loop" in r.getMessage() for r in failed), [r.getMessage() for r in caplog.records]
    for record in failed:
        assert "leases are refused by policy" in record.getMessage()
        assert record.exc_info is None  # the database's message, not a traceback


def test_a_read_only_database_is_waited_out_on_new_connections(
    postgres_database: str, caplog: pytest.LogCaptureFixture
) -> None:
    # A standby (a failover under way, a name still pointing at the old primary) or a database set
    # read-only for maintenance. Before: a BackendError, so the worker stopped at its first acquire and
    # a producer was told the database had failed; and a pooled connection to it stayed read-only.
    with App(postgres_database, migrate=True) as app:
        ids = [app.send("t", queue="q").id for _ in range(5)]
    _alter(postgres_database, "default_transaction_read_only", "on")
    with App(postgres_database) as app:

        @app.task(queue="q", name="t")
        def t() -> None:
            pass

        with pytest.raises(
            BackendUnavailable, match=r"^PostgreSQL is read-only \(jobs_insert_many\): .* \(a standby, or"
        ):
            app.send("t", queue="q")

        def writable_again() -> None:  # only connections opened from now on see it
            with psycopg.connect(postgres_database, autocommit=True) as conn:
                conn.execute("SET default_transaction_read_only = off")
                conn.execute(
                    sql.SQL("ALTER DATABASE {} RESET default_transaction_read_only").format(
                        sql.Identifier(conn.info.dbname)
                    )
                )

        with caplog.at_level(logging.INFO, logger="psycopg.pool"):
            worker = _drain_meanwhile(app, 1.0, writable_again)
        assert worker.exit_code == 0
        assert {app.job(job_id).state for job_id in ids} == {"completed"}
        # The pool replaces its connections quietly (before: psycopg_pool's WARNING "discarding closed
        # connection" for each one the backend closed, ~30 lines per worker per read-only spell).
        assert not [r for r in caplog.records if r.levelno >= logging.WARNING and r.name == "psycopg.pool"]
        # The producer's pool, too, leaves each read-only connection at its first refusal: a producer
        # retrying BackendUnavailable gets through (before, never).
        for _ in range(10):
            try:
                app.send("t", queue="q")
                break
            except BackendUnavailable:
                time.sleep(0.05)
        else:
            pytest.fail("every send still met a read-only connection")


def test_a_statement_timeout_is_reported_as_such_not_as_a_lost_server(postgres_database: str) -> None:
    # Before: "PostgreSQL unavailable (queues_stats): canceling statement due to statement timeout".
    with App(postgres_database, migrate=True) as app:
        app.send("t", queue="q")
    _alter(postgres_database, "statement_timeout", "100ms")
    with App(postgres_database) as app, psycopg.connect(postgres_database) as holder:
        holder.execute("LOCK TABLE jobs IN ACCESS EXCLUSIVE MODE")  # held until the block ends
        with pytest.raises(BackendUnavailable, match=r"^PostgreSQL cancelled queues_stats: .*statement timeout"):
            app.admin.queues()


def test_a_schema_off_the_search_path_is_named_as_a_cause(postgres_database: str) -> None:
    with App(postgres_database, migrate=True):
        pass
    elsewhere = f"{postgres_database}?options=-c%20search_path%3Delsewhere"
    with App(elsewhere) as app, pytest.raises(BackendError, match="or is not on this connection's search_path"):
        app.admin.queues()


def test_outcome_connections_commit_asynchronously_without_a_startup_option(postgres_database: str) -> None:
    # Before: the outcome pool and the worker's acquire and finish connections carried a startup option
    # (-c synchronous_commit=off), which PgBouncer refuses ("unsupported startup parameter: options"):
    # behind it, no worker could connect and every job stayed pending. Now it is a SET after connecting.
    backend = PostgresBackend(postgres_database)
    statements = backend.loop_statements()

    async def on_the_loop() -> tuple[object, object]:
        conn = await statements._connection("jobs_finish_many")
        row = await (await conn.execute("SHOW synchronous_commit")).fetchone()
        return conn.info.get_parameters().get("options"), row

    try:
        with backend._acks.connection() as conn:
            assert conn.info.get_parameters().get("options") is None
            assert conn.execute("SHOW synchronous_commit").fetchone() == ("off",)
        with backend._pool.connection() as conn:  # inserts wait for the WAL flush
            assert conn.execute("SHOW synchronous_commit").fetchone() == ("on",)
        assert asyncio.run(on_the_loop()) == (None, ("off",))
    finally:
        statements.close()
        backend.close()


def test_a_worker_whose_host_clock_runs_ahead_keeps_the_databases_time(
    postgres_database: str, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    # Leases are judged by each worker's clock. Before: a worker on a host 5 minutes ahead found the
    # 30 s lease another worker held on a running job expired, rescued it and ran it again.
    monkeypatch.setattr(_clock, "host_now", lambda: datetime.now(UTC) + timedelta(minutes=5))
    with App(postgres_database, migrate=True) as app:

        @app.task(queue="q", name="t")
        def t() -> None:
            pass

        # The first send waits 0.5 s only for the first read of the database's clock: on a loaded machine (CI, session
        # 46) opening the pool took longer, the job went by the host's clock, 5 minutes ahead, and nothing was due.
        app.clock.measure(wait=30)
        held = t.delay().id
        leased = app.backend.jobs_acquire(JobsAcquireParams("q", 1, 30.0, "elsewhere", datetime.now(UTC)))
        assert [d.id for d in leased] == [held]
        done = t.delay().id
        worker = Worker(app, poll_interval=0.02, rescue_interval=0.05)

        async def run_a_while() -> None:
            running = asyncio.create_task(worker.run())
            await asyncio.sleep(1.5)
            worker.stop()
            await asyncio.wait_for(running, 30)

        with caplog.at_level(logging.WARNING, logger="conveyor"):
            asyncio.run(run_a_while())
        assert worker.exit_code == 0
        assert app.job(done).state == "completed"
        still = app.job(held)
        assert (still.state, still.attempts) == ("processing", 0), still  # its lease holds
        finished = app.job(done).finished_at
        assert finished is not None and abs(finished - datetime.now(UTC)) < timedelta(seconds=30)
    skew = [r.getMessage() for r in caplog.records if "clock" in r.getMessage()]
    assert len(skew) == 1 and "is 300.0 s ahead of the database's" in skew[0], skew


def test_a_producer_whose_host_clock_is_off_stamps_its_jobs_by_the_databases_time(
    postgres_database: str, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    # Before: a producer on a host 5 minutes ahead wrote run_at 5 minutes ahead: no worker (on the
    # database's time) took its jobs for 5 minutes; one 5 minutes behind put its jobs ahead of older
    # ones and its delays ran 5 minutes early. The operator API's times (ages, expiries) are the same.
    for queue, skew in (("ahead", timedelta(minutes=5)), ("behind", timedelta(minutes=-5))):
        monkeypatch.setattr(_clock, "host_now", lambda skew=skew: datetime.now(UTC) + skew)
        with App(postgres_database, migrate=True) as app:

            @app.task(queue=queue, name="t")
            def t() -> None:
                pass

            caplog.clear()
            with caplog.at_level(logging.WARNING, logger="conveyor"):
                # The first send waits 0.5 s only for the first read of the database's clock (past that it goes on by
                # the host's): on a loaded machine opening the pool took longer, and this test failed (session 46).
                app.clock.measure(wait=30)
                now_job = t.delay().id
                later = t.send(None, delay=60).id
                batch = [j.id for j in t.delay_many([{}, {}])]
            lines = [r.getMessage() for r in caplog.records if "clock" in r.getMessage()]
            assert len(lines) == 1 and "300.0 s" in lines[0], lines
            real = datetime.now(UTC)
            assert abs(app.job(now_job).run_at - real) < timedelta(seconds=10)
            assert abs(app.job(later).run_at - (real + timedelta(seconds=60))) < timedelta(seconds=10)
            assert all(abs(app.job(j).run_at - real) < timedelta(seconds=10) for j in batch)
            leased = app.backend.jobs_acquire(JobsAcquireParams(queue, 10, 30.0, "w", real + timedelta(seconds=1)))
            assert {d.id for d in leased} == {now_job, *batch}  # ready now, the delayed one not
            assert abs(app.clock() - real) < timedelta(seconds=10)
        caplog.clear()


def _slow_archive(url: str, seconds_per_row: float) -> None:
    """Make every row a finish archives cost ``seconds_per_row`` (a slow disk, a heavy trigger of the user's)."""
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(
            sql.SQL(
                "CREATE FUNCTION slow_row() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN "
                "PERFORM pg_sleep({}); RETURN NULL; END $$; "
                "CREATE TRIGGER slow_row AFTER INSERT ON archive FOR EACH ROW EXECUTE FUNCTION slow_row()"
            ).format(sql.Literal(seconds_per_row))
        )


def test_a_finish_batch_longer_than_the_statement_timeout_is_split_not_retried_forever(
    postgres_database: str, caplog: pytest.LogCaptureFixture
) -> None:
    # 200 outcomes flushed together take ~1 s to archive, past the database's 300 ms statement_timeout;
    # 50 take ~0.25 s. Before: the cancelled batch was retried whole, forever, and no job was ever acked.
    with App(postgres_database, migrate=True) as app:
        app.send_many([Message("t", {"i": i}, queue="q") for i in range(200)])
    _slow_archive(postgres_database, 0.005)
    _alter(postgres_database, "statement_timeout", "300ms")
    runs: list[int] = []
    with App(postgres_database) as app:

        @app.task(queue="q", name="t")
        def t(i: int) -> None:
            runs.append(i)

        started = time.monotonic()
        with caplog.at_level(logging.WARNING, logger="conveyor.worker"):
            # A long flush interval, so that every outcome is in the first flush.
            worker = Worker(app, burst=True, poll_interval=0.02, flush_interval=1.0)
            asyncio.run(asyncio.wait_for(worker.run(), timeout=60))
        assert worker.exit_code == 0
        assert time.monotonic() - started < 30
        assert sorted(runs) == list(range(200))
        assert [(q.pending, q.processing, q.completed) for q in app.admin.queues()] == [(0, 0, 200)]
    split = [r.getMessage() for r in caplog.records if "splitting" in r.getMessage()]
    assert split and "statement timeout" in split[0], [r.getMessage() for r in caplog.records][:5]


def test_one_outcome_the_statement_timeout_cancels_is_retried_until_it_fits_never_dead_lettered(
    postgres_database: str,
) -> None:
    # Nothing is left to split: the one finish is retried with backoff, as while the database is away.
    with App(postgres_database, migrate=True) as app:
        job_id = app.send("t", {"i": 1}, queue="q").id
    with psycopg.connect(postgres_database, autocommit=True) as conn:
        conn.execute(
            "CREATE TABLE slow (on_ boolean NOT NULL); INSERT INTO slow VALUES (true); "
            "CREATE FUNCTION slow_row() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN "
            "IF (SELECT on_ FROM slow) THEN PERFORM pg_sleep(1); END IF; RETURN NULL; END $$; "
            "CREATE TRIGGER slow_row AFTER INSERT ON archive FOR EACH ROW EXECUTE FUNCTION slow_row()"
        )
    _alter(postgres_database, "statement_timeout", "300ms")
    runs: list[int] = []

    def fast_again() -> None:
        with psycopg.connect(postgres_database, autocommit=True) as conn:
            conn.execute("UPDATE slow SET on_ = false")

    with App(postgres_database) as app:

        @app.task(queue="q", name="t")
        def t(i: int) -> None:
            runs.append(i)

        timer = threading.Timer(2.0, fast_again)
        timer.start()
        try:
            worker = _drain(app)
        finally:
            timer.join()
        assert worker.exit_code == 0
        assert worker.counters.backend_errors >= 2  # cancelled, retried
        assert runs == [1]
        assert app.job(job_id).state == "completed"


def test_an_app_that_started_while_the_database_was_away_reads_its_clock_once_it_is_back(
    postgres_database: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Before: a worker that started during an outage (a boot order, a PostgreSQL restart) never read
    # the server's clock again; on a host 5 minutes ahead it ran delayed jobs early and judged leases by
    # its own clock until it restarted.
    from urllib.parse import urlsplit, urlunsplit

    from tests.chaos._proxy import TcpProxy

    with App(postgres_database, migrate=True) as setup:
        setup.backend  # noqa: B018 (opening it migrates)
    monkeypatch.setattr(_clock, "host_now", lambda: datetime.now(UTC) + timedelta(minutes=5))
    monkeypatch.setattr(_clock, "_RETRY_AFTER", 0.2)
    parts = urlsplit(postgres_database)
    proxy = TcpProxy(parts.hostname or "127.0.0.1", parts.port or 5432)
    proxy.target = ("127.0.0.1", 1)  # nothing listens there: every connection is refused
    proxy.start()
    try:
        url = urlunsplit(parts._replace(netloc=f"{parts.username}@127.0.0.1:{proxy.port}"))
        with App(url, backend=PostgresBackend(url, connect_timeout=0.5)) as app:

            @app.task(queue="q", name="t")
            def t() -> None:
                pass

            worker = Worker(app, poll_interval=0.02)

            async def outage_then_back() -> timedelta:
                running = asyncio.create_task(worker.run())
                await asyncio.sleep(1.5)  # the worker started, its clock read failed (0.5 s to connect)
                assert app.clock.offset == timedelta(0)
                proxy.target = (parts.hostname or "127.0.0.1", parts.port or 5432)
                for _ in range(500):  # the pool reconnects with a backoff of a few seconds
                    if app.clock.offset:
                        break
                    await asyncio.sleep(0.02)
                worker.stop()
                await asyncio.wait_for(running, 30)
                return app.clock() - datetime.now(UTC)

            off = asyncio.run(outage_then_back())
        assert abs(off) < timedelta(seconds=5), off
        assert worker.exit_code == 0
    finally:
        proxy.close()


def test_a_schedule_added_by_the_operator_api_ticks_by_the_databases_time(
    postgres_database: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Before: admin.add_schedule (`conveyor schedules add`) worked out the first tick by the host's
    # clock: on a host 5 minutes ahead an every-minute schedule skipped its first 5 ticks.
    monkeypatch.setattr(_clock, "host_now", lambda: datetime.now(UTC) + timedelta(minutes=5))
    with App(postgres_database, migrate=True) as app:
        # The first read of the database's clock is waited for 0.5 s only (past that a sender goes on by the host's
        # clock while it completes): on a loaded machine opening the pool took longer, and this test failed.
        app.clock.measure(wait=30)
        added = app.admin.add_schedule("minutely", "* * * * *", "t", actor="test")
        assert added.next_run_at - datetime.now(UTC) <= timedelta(seconds=61), added.next_run_at


def test_a_migrate_whose_schema_is_picked_by_user_warns_of_the_other_set(
    postgres_database: str, caplog: pytest.LogCaptureFixture
) -> None:
    # The default search_path is "$user", public: a role with a schema of its name gets tables of its own
    # from `conveyor migrate`, silently, and its producers' jobs never meet workers connecting as others.
    role = f"conveyor_u_{uuid.uuid4().hex[:8]}"
    with psycopg.connect(postgres_database, autocommit=True) as conn:
        conn.execute(sql.SQL("CREATE ROLE {} LOGIN").format(sql.Identifier(role)))
        conn.execute(sql.SQL("CREATE SCHEMA {0} AUTHORIZATION {0}").format(sql.Identifier(role)))
        conn.execute(sql.SQL("CREATE SCHEMA tenant_a AUTHORIZATION {}").format(sql.Identifier(role)))
    try:
        with App(postgres_database, migrate=True) as public:
            public.backend  # noqa: B018 (opening it migrates: a set in public)
        as_role = postgres_database.replace("postgres@", f"{role}@", 1)
        with caplog.at_level(logging.WARNING, logger="conveyor"):
            App(f"{as_role}?options=-c%20search_path%3Dtenant_a", migrate=True).backend.close()  # named: none
            assert not [r for r in caplog.records if "search_path" in r.getMessage()]
            App(as_role, migrate=True).backend.close()
        (line,) = [r.getMessage() for r in caplog.records if "search_path" in r.getMessage()]
        assert f"schema {role}, named after this role" in line and "public, tenant_a hold another set" in line, line
    finally:
        with psycopg.connect(postgres_database, autocommit=True) as conn:
            conn.execute(sql.SQL("DROP OWNED BY {}").format(sql.Identifier(role)))
            conn.execute(sql.SQL("DROP ROLE {}").format(sql.Identifier(role)))


def _slow_updates(url: str, before: str, after: str) -> None:
    """Make every update of a jobs row from state ``before`` to ``after`` cost 4 ms (a user's trigger,
    a slow disk)."""
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(
            sql.SQL(
                "CREATE FUNCTION slow_row() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN "
                "PERFORM pg_sleep(0.004); RETURN NEW; END $$; "
                "CREATE TRIGGER slow_row BEFORE UPDATE ON jobs FOR EACH ROW "
                "WHEN (OLD.state = {} AND NEW.state = {}) EXECUTE FUNCTION slow_row()"
            ).format(sql.Literal(before), sql.Literal(after))
        )


def test_heartbeats_longer_than_the_statement_timeout_are_split_and_keep_every_lease(
    postgres_database: str, caplog: pytest.LogCaptureFixture
) -> None:
    # Every update of a running job's row costs 4 ms (a user's trigger, a slow disk): extending 100
    # leases takes ~0.4 s, past the database's 300 ms statement_timeout; 50 take ~0.2 s. Before: the
    # heartbeat (and the counting of starts) retried the same cancelled batch forever, the leases ran out,
    # the jobs were rescued and ran again, and the completer, stuck behind the counting, acked nothing.
    with App(postgres_database, migrate=True) as app:
        app.send_many([Message("t", {"i": i}, queue="q") for i in range(100)])
    _slow_updates(postgres_database, "processing", "processing")
    _alter(postgres_database, "statement_timeout", "300ms")
    runs: list[int] = []
    with App(postgres_database) as app:

        @app.task(queue="q", name="t", visibility_timeout=3.0)
        async def t(i: int) -> None:
            runs.append(i)
            await asyncio.sleep(6.5)  # two leases long: only heartbeats keep the jobs

        with caplog.at_level(logging.WARNING, logger="conveyor.worker"):
            worker = Worker(app, burst=True, poll_interval=0.02, concurrency=100, rescue_interval=0.5)
            asyncio.run(asyncio.wait_for(worker.run(), timeout=60))
        assert worker.exit_code == 0
        assert sorted(runs) == list(range(100))  # each once
        assert (worker.counters.rescued, worker.counters.lost_leases) == (0, 0)
        assert [(q.pending, q.processing, q.completed) for q in app.admin.queues()] == [(0, 0, 100)]
    split = [r.getMessage() for r in caplog.records if r.getMessage().startswith("heartbeat: the database cancelled")]
    assert split and split[0].startswith("heartbeat: the database cancelled a batch of 100"), split[:5]
    # The size that fits is kept: a warning when it shrinks (100 -> 50 at most -> ...), not one or more
    # at every beat (before: 3 beats, each split again and warned again).
    assert 1 <= len(split) <= 3, split


def _locked(url: str, job_id: uuid.UUID, seconds: float) -> threading.Thread:
    """Hold ``job_id``'s row locked for ``seconds`` from another session (an operator's open transaction)."""
    locked = threading.Event()

    def hold() -> None:
        with psycopg.connect(url) as conn:
            conn.execute("SELECT 1 FROM jobs WHERE id = %s FOR UPDATE", (job_id,))
            locked.set()
            time.sleep(seconds)
            conn.rollback()

    thread = threading.Thread(target=hold, daemon=True)
    thread.start()
    assert locked.wait(10)
    return thread


def test_a_heartbeat_skips_a_row_another_transaction_holds_locked_and_keeps_the_other_leases(
    postgres_database: str,
) -> None:
    # Before: the heartbeat's UPDATE waited for the locked row; past the statement_timeout the batch was
    # split down to that row, retried inline until the lock went, and meanwhile no other lease was
    # extended: they expired, were rescued and their jobs ran again.
    with App(postgres_database, migrate=True) as app:
        ids = app.send_many([Message("t", {"i": i}, queue="q") for i in range(10)])
    _alter(postgres_database, "statement_timeout", "300ms")
    runs: list[int] = []
    with App(postgres_database) as app:

        @app.task(queue="q", name="t", visibility_timeout=2.0)
        async def t(i: int) -> None:
            runs.append(i)
            await asyncio.sleep(7)  # three leases long: only heartbeats keep the jobs

        worker = Worker(app, burst=True, poll_interval=0.02, concurrency=10, rescue_interval=0.3)

        async def scenario() -> None:
            task = asyncio.create_task(worker.run())
            while len(runs) < 10:
                await asyncio.sleep(0.02)
            await asyncio.to_thread(lambda: _locked(postgres_database, ids[0].id, 5.0).join())
            await task

        asyncio.run(asyncio.wait_for(scenario(), timeout=60))
        assert worker.exit_code == 0
        # The locked job's own lease could not be extended for 5 s: it may have run again after the lock.
        assert sorted(i for i in runs if i != 0) == list(range(1, 10)), runs  # the others each once
        assert [(q.pending, q.processing, q.completed) for q in app.admin.queues()] == [(0, 0, 10)]
    # The seam: the locked row is skipped (held, not extended), the others extended, without waiting.
    with App(postgres_database) as app:
        app.send_many([Message("t", {}, queue="r") for _ in range(2)])
        backend = app.backend
        leased = backend.jobs_acquire(JobsAcquireParams("r", 2, 30.0, "w", datetime.now(UTC)))
        holder = _locked(postgres_database, leased[0].id, 2.0)
        started = time.monotonic()
        refs = [LeaseRef(d.id, d.receipt) for d in leased]
        held = backend.leases_extend_many(LeasesExtendParams(refs, 600.0, datetime.now(UTC), wait=False))
        assert time.monotonic() - started < 1.0
        assert held == [d.id for d in leased]
        holder.join()
        with psycopg.connect(postgres_database) as conn:
            ends = dict(conn.execute("SELECT id, lease_expires_at FROM jobs WHERE queue = 'r'").fetchall())
        assert ends[leased[0].id] == leased[0].lease_expires_at  # skipped this time
        assert ends[leased[1].id] > leased[1].lease_expires_at + timedelta(seconds=500)


def test_acks_are_not_held_up_by_the_start_count_of_a_row_another_transaction_holds_locked(
    postgres_database: str,
) -> None:
    # A job running a while has its start counted from the heartbeat, by the completer, ahead of the
    # outcomes it flushes. Before: that count waited for the job's row, locked by an operator's open
    # transaction, and no outcome was written until the lock went (here 5 s).
    with App(postgres_database, migrate=True) as app:
        (long_id,) = app.send_many([Message("long", {}, queue="q")])
    with App(postgres_database) as app:
        started = threading.Event()

        @app.task(queue="q", name="long", visibility_timeout=9.0)
        async def long() -> None:
            started.set()
            await asyncio.sleep(7)

        @app.task(queue="q", name="quick")
        async def quick() -> None:
            pass

        worker = Worker(app, burst=True, poll_interval=0.02, concurrency=5)

        def acked() -> int:
            with psycopg.connect(postgres_database) as conn:
                row = conn.execute("SELECT count(*) FROM archive WHERE task = 'quick'").fetchone()
            return int(row[0]) if row else 0

        async def scenario() -> int:
            task = asyncio.create_task(worker.run())
            await asyncio.to_thread(started.wait, 10)
            holder = await asyncio.to_thread(_locked, postgres_database, long_id.id, 5.0)
            await asyncio.sleep(3.5)  # the heartbeat (every 3 s) has asked for the long job's start count
            app.send_many([Message("quick", {}, queue="q") for _ in range(20)])
            await asyncio.sleep(1.2)
            during = await asyncio.to_thread(acked)  # the lock is still held
            await asyncio.to_thread(holder.join)
            await task
            return during

        during = asyncio.run(asyncio.wait_for(scenario(), timeout=60))
        assert during == 20
        assert worker.exit_code == 0
        assert [(q.pending, q.processing, q.completed) for q in app.admin.queues()] == [(0, 0, 21)]


def test_a_rescue_longer_than_the_statement_timeout_takes_fewer_rows_a_statement(
    postgres_database: str, caplog: pytest.LogCaptureFixture
) -> None:
    # 200 expired leases whose return to pending costs 4 ms a row (~0.8 s, past 300 ms). Before: the same
    # rescue of up to 1,000 rows was retried forever and the jobs never ran again.
    with App(postgres_database, migrate=True) as app:
        app.send_many([Message("t", {"i": i}, queue="q") for i in range(200)])
        now = datetime.now(UTC)
        taken = app.backend.jobs_acquire(JobsAcquireParams("q", 200, 0.05, "dead-worker", now))
        assert len(taken) == 200
    _slow_updates(postgres_database, "processing", "pending")
    _alter(postgres_database, "statement_timeout", "300ms")
    time.sleep(0.1)  # the leases expire
    runs: list[int] = []
    with App(postgres_database) as app:

        @app.task(queue="q", name="t")
        def t(i: int) -> None:
            runs.append(i)

        with caplog.at_level(logging.WARNING, logger="conveyor.worker"):
            worker = Worker(app, burst=True, poll_interval=0.02, rescue_interval=0.2)
            asyncio.run(asyncio.wait_for(worker.run(), timeout=60))
        assert worker.exit_code == 0
        assert sorted(runs) == list(range(200))
        assert worker.counters.rescued == 200
    cut = [r.getMessage() for r in caplog.records if r.getMessage().startswith("rescue: the database cancelled")]
    assert cut and "trying 500" in cut[0], cut


def test_an_acquire_longer_than_the_statement_timeout_leases_fewer_jobs_a_statement(
    postgres_database: str, caplog: pytest.LogCaptureFixture
) -> None:
    # Leasing a row costs 4 ms: an acquire of 200 (~0.8 s) runs past 300 ms, one of 50 does not.
    # Before: the same acquire was retried forever and the worker ran nothing.
    with App(postgres_database, migrate=True) as app:
        app.send_many([Message("t", {"i": i}, queue="q") for i in range(200)])
    _slow_updates(postgres_database, "pending", "processing")
    _alter(postgres_database, "statement_timeout", "300ms")
    runs: list[int] = []
    with App(postgres_database) as app:

        @app.task(queue="q", name="t")
        def t(i: int) -> None:
            runs.append(i)

        with caplog.at_level(logging.WARNING, logger="conveyor.worker"):
            worker = Worker(app, burst=True, poll_interval=0.02, prefetch=200)
            asyncio.run(asyncio.wait_for(worker.run(), timeout=60))
        assert worker.exit_code == 0
        assert sorted(runs) == list(range(200))
    cut = [r.getMessage() for r in caplog.records if r.getMessage().startswith("acquire: the database cancelled")]
    assert cut and cut[0].startswith("acquire: the database cancelled an acquire of 200 ("), cut


@contextlib.contextmanager
def _role(url: str, owns_public: bool = True) -> Iterator[tuple[str, Callable[[bool], None]]]:
    """A role of its own (owning the public schema, so that it migrates its own tables; or granted
    nothing): its URL, and a switch that grants or revokes its INSERT on the archive."""
    role = f"conveyor_u_{uuid.uuid4().hex[:8]}"
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(sql.SQL("CREATE ROLE {} LOGIN").format(sql.Identifier(role)))
        if owns_public:
            conn.execute(sql.SQL("ALTER SCHEMA public OWNER TO {}").format(sql.Identifier(role)))

    def archive(grant: bool) -> None:
        with psycopg.connect(url, autocommit=True) as conn:
            statement = "GRANT INSERT ON archive TO {}" if grant else "REVOKE INSERT ON archive FROM {}"
            conn.execute(sql.SQL(statement).format(sql.Identifier(role)))

    try:
        yield url.replace("postgres@", f"{role}@", 1), archive
    finally:
        with psycopg.connect(url, autocommit=True) as conn:
            conn.execute(sql.SQL("DROP OWNED BY {}").format(sql.Identifier(role)))
            conn.execute(sql.SQL("DROP ROLE {}").format(sql.Identifier(role)))


def test_a_revoked_privilege_is_waited_out_and_no_finished_job_runs_again(
    postgres_database: str, caplog: pytest.LogCaptureFixture
) -> None:
    # A grant revoked for a while (an operator's mistake, a migration of the roles): every finish is
    # refused alike. Before, the worker split each refused batch of outcomes down to single jobs, failed
    # to dead-letter them too, dropped their results, and every job finished meanwhile ran again.
    with _role(postgres_database) as (as_role, archive), App(as_role, migrate=True) as app:
        runs: dict[int, int] = {}

        @app.task(queue="q")
        def t(i: int) -> None:
            runs[i] = runs.get(i, 0) + 1

        jobs = [t.send({"i": i}) for i in range(20)]
        archive(False)
        with caplog.at_level(logging.WARNING, logger="conveyor"):
            worker = _drain_meanwhile(app, 1.5, lambda: archive(True))
        assert worker.exit_code == 0
        said = " ".join(r.getMessage() for r in caplog.records)
        assert "refused a privilege" in said and "permission denied for table archive" in said, said
        assert runs == {i: 1 for i in range(20)}
        assert {app.job(job.id).state for job in jobs} == {"completed"}


def test_a_worker_whose_outcomes_wait_leases_no_more_jobs(
    postgres_database: str, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    # While the outcomes cannot be written but leases can, a worker ran the whole queue and held every
    # result in memory; past Fetcher.max_unwritten it now stops leasing until they are written.
    monkeypatch.setattr(Fetcher, "max_unwritten", 20, raising=False)
    with _role(postgres_database) as (as_role, archive), App(as_role, migrate=True) as app:
        runs: dict[int, int] = {}
        ran_when_granted: list[int] = []

        @app.task(queue="q")
        def t(i: int) -> None:
            runs[i] = runs.get(i, 0) + 1

        t.delay_many([{"i": i} for i in range(2000)])
        archive(False)

        def grant() -> None:
            ran_when_granted.append(sum(runs.values()))
            archive(True)

        with caplog.at_level(logging.WARNING, logger="conveyor"):
            worker = _drain_meanwhile(app, 2.0, grant)
        assert worker.exit_code == 0
        assert ran_when_granted[0] < 500, ran_when_granted  # not the whole queue
        assert runs == {i: 1 for i in range(2000)}
        assert any("leasing no more jobs" in r.getMessage() for r in caplog.records)


def test_a_role_never_granted_fails_at_once_not_waited_for(postgres_database: str) -> None:
    # Only a worker's unwritten outcomes wait for a grant: a producer, and a worker that cannot fetch,
    # fail at once (a `--burst` run with a role never granted must end, not wait for ever).
    with App(postgres_database, migrate=True) as app:
        app.send("t", queue="q")
    with _role(postgres_database, owns_public=False) as (as_role, _), App(as_role) as app:

        @app.task(queue="q")
        def t() -> None:
            pass

        with pytest.raises(BackendError, match=r"refused a privilege .*permission denied") as refused:
            app.send("t", queue="q")
        assert not isinstance(refused.value, BackendUnavailable)
        assert _drain(app).exit_code == 1
