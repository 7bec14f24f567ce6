"""An App given its backend (``App(backend=...)``): its database is that backend's, and so is its
``database_url`` (not ``$CONVEYOR_DATABASE_URL``'s, nor the default SQLite file's)."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from conveyor import App, BackendError, ConfigurationError, JobNotFoundError
from conveyor.backends.postgres import PostgresBackend
from conveyor.cli import main as conveyor_main


def test_admin_migrate_migrates_the_given_backend(
    postgres_database: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Before: migrate() opened database_url (the default ./conveyor.db), migrated that file, and the
    # App's sends then failed on PostgreSQL: "the Conveyor schema is missing in this database".
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("CONVEYOR_DATABASE_URL", raising=False)
    app = App(backend=PostgresBackend(postgres_database))
    try:
        assert "0001_init.sql" in app.admin.migrate()
        assert app.admin.migrate() == []
        assert app.send("t", {}, queue="q") is not None
        assert not (tmp_path / "conveyor.db").exists()
    finally:
        app.close()


def test_a_given_backend_is_migrated_at_first_use_as_its_url_would_be(postgres_database: str, tmp_path: Path) -> None:
    # Before: a given backend was never migrated: App(backend=SqliteBackend(path)) failed its first
    # send with "no such table: jobs", and migrate=True was ignored.
    from conveyor.backends.sqlite import SqliteBackend

    with App(backend=SqliteBackend(str(tmp_path / "given.db"))) as app:  # the embedded engine: always
        assert app.send("t", {}, queue="q") is not None
    with App(backend=PostgresBackend(postgres_database)) as app, pytest.raises(BackendError, match="schema is missing"):
        app.send("t", {}, queue="q")  # PostgreSQL: only when asked
    with App(backend=PostgresBackend(postgres_database), migrate=True) as app:
        assert app.send("t", {}, queue="q") is not None
        assert app.admin.migrate() == []


def test_a_database_url_cannot_replace_a_given_backend(postgres_database: str) -> None:
    app = App(postgres_database, backend=PostgresBackend(postgres_database))
    try:
        app.database_url = postgres_database  # the same: nothing changes
        with pytest.raises(ConfigurationError, match=r"given its backend .* \(sqlite:///other.db\): give the URL or"):
            app.database_url = "sqlite:///other.db"
        assert app.database_url == postgres_database
    finally:
        app.close()
    plain = App("sqlite:///a.db")
    plain.database_url = "sqlite:///b.db"  # an App of a URL may be pointed elsewhere before its first use
    assert plain.database_url == "sqlite:///b.db"


@contextmanager
def _app_module(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, backend: str, env: str | None = None) -> Iterator[str]:
    """A module in ``tmp_path`` (the working directory) holding ``app = App(backend=<backend>)``, and
    ``$CONVEYOR_DATABASE_URL`` set to ``env`` or unset; yields the module's name."""
    module = "given_app_" + tmp_path.name.replace("-", "_")
    (tmp_path / f"{module}.py").write_text(
        "from conveyor import App\nfrom conveyor.backends.postgres import PostgresBackend\n"
        f"from conveyor.backends.sqlite import MemoryBackend, SqliteBackend\napp = App(backend={backend})\n"
    )
    monkeypatch.chdir(tmp_path)
    monkeypatch.syspath_prepend(str(tmp_path))
    if env is None:
        monkeypatch.delenv("CONVEYOR_DATABASE_URL", raising=False)
    else:
        monkeypatch.setenv("CONVEYOR_DATABASE_URL", env)
    try:
        yield module
    finally:
        sys.modules.pop(module, None)


def test_cli_db_with_an_app_that_brings_its_backend_is_one_line(
    postgres_database: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    # Before: stats and workers used the app's backend and ignored --db without a word; migrate used --db.
    with _app_module(tmp_path, monkeypatch, f"PostgresBackend({postgres_database!r})") as module:
        for argv in (["stats"], ["migrate"], ["worker", f"{module}:app", "--burst"]):
            code = conveyor_main(["--app", f"{module}:app", "--db", "postgresql://u:pw@127.0.0.1:1/x", *argv])
            err = capsys.readouterr().err
            assert code == 1 and err.count("\n") == 1, (argv, code, err)
            assert "given its backend" in err and "pw" not in err, err
        assert conveyor_main(["--app", f"{module}:app", "migrate"]) == 0
        assert "applied" in capsys.readouterr().out


def test_the_database_url_of_an_app_given_its_backend_is_the_backends(
    postgres_database: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Before: database_url was $CONVEYOR_DATABASE_URL's (or the default file) while the App used its
    # backend: conveyor serve handed that URL to its processes, and the CLI's env check passed.
    from conveyor.backends.sqlite import MemoryBackend, SqliteBackend

    monkeypatch.setenv("CONVEYOR_DATABASE_URL", postgres_database)
    path = str(tmp_path / "given.db")
    assert App(backend=SqliteBackend(path)).database_url == "sqlite:///" + path
    assert App(backend=MemoryBackend()).database_url == "memory://"
    with App(backend=PostgresBackend(postgres_database)) as app:
        assert app.database_url == postgres_database
        app.database_url = postgres_database.replace("postgresql://", "postgres://", 1)  # the same database
        with pytest.raises(ConfigurationError, match="another database"):
            app.database_url = "sqlite:///" + path
    with pytest.raises(ConfigurationError, match=r"given its backend \(App\(backend=...\)\) on sqlite:///"):
        App(postgres_database, backend=SqliteBackend(path))
    App("memory://", backend=MemoryBackend())  # the URL a private database's backend has


def test_the_same_database_spelled_another_way_is_the_same(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # A helper's sweep: an absolute $CONVEYOR_DATABASE_URL for the file an app names relative, or a URL
    # with the default port or a password written out, was refused as "another database".
    from conveyor.backends import same_database
    from conveyor.backends.sqlite import SqliteBackend

    monkeypatch.chdir(tmp_path)
    app = App(backend=SqliteBackend(Path("t.db")))  # a path object, as sqlite3 takes (was a TypeError)
    app.database_url = f"sqlite:///{tmp_path}/t.db"
    app.database_url = "sqlite:///./t.db"
    with pytest.raises(ConfigurationError, match="another database"):
        app.database_url = "sqlite:///u.db"
    assert same_database("postgres://u:pw@h/db?sslmode=disable", "postgresql://u@h:5432/db")
    assert not same_database("postgresql://u@h/db", "postgresql://u@h/other")
    assert not same_database("postgresql://u@h/db", "postgresql://v@h/db")
    # A backend on a file whose name a URL cannot carry ("?"): another database, said as such.
    odd = App(backend=SqliteBackend(str(tmp_path / "odd?v=1.db")))
    with pytest.raises(ConfigurationError, match="another database"):
        odd.database_url = "sqlite:///other.db"
    with pytest.raises(ConfigurationError, match="must be a string"):
        App(0, backend=SqliteBackend("t.db"))  # type: ignore[arg-type]


@pytest.mark.parametrize("argv", [["stats"], ["worker", "{module}:app", "--burst"]])
def test_cli_env_database_against_an_app_that_brings_its_backend_is_one_line(
    argv: list[str],
    postgres_database: str,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    # Before: with $CONVEYOR_DATABASE_URL set, the CLI used the app's own backend without a word (a
    # worker drained an app's private in-memory database, found nothing and exited 0).
    own = f"SqliteBackend({str(tmp_path / 'own.db')!r})"
    with _app_module(tmp_path, monkeypatch, own, env=postgres_database) as module:
        code = conveyor_main(["--app", f"{module}:app", *(a.format(module=module) for a in argv)])
    err = capsys.readouterr().err
    assert code == 1 and err.count("\n") == 1, (code, err)
    assert "$CONVEYOR_DATABASE_URL" in err and "another database" in err, err


def test_cli_worker_processes_of_an_app_on_a_file_a_url_cannot_name(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    # A helper's sweep: `worker -p 2` checked the app's URL, now its backend's ("sqlite URLs take no options").
    with _app_module(tmp_path, monkeypatch, f"SqliteBackend({str(tmp_path / 'odd?v=1.db')!r})") as module:
        assert conveyor_main(["worker", f"{module}:app", "--burst", "-p", "2"]) == 0, capsys.readouterr().err


def test_cli_worker_of_an_app_on_a_private_in_memory_database_fails(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    with _app_module(tmp_path, monkeypatch, "MemoryBackend()") as module:
        assert conveyor_main(["worker", f"{module}:app", "--burst"]) == 1
    assert "private in-memory database" in capsys.readouterr().err


@pytest.mark.parametrize("engine", ["postgres", "sqlite", "memory"])
def test_an_app_given_its_backend_reopens_that_database_after_close(
    engine: str, postgres_database: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Before: close() forgot the backend and the next call opened database_url, the default
    # ./conveyor.db (conveyor serve closes its App before serving: POST 202, the job in that file).
    from conveyor.backends.sqlite import MemoryBackend, SqliteBackend

    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("CONVEYOR_DATABASE_URL", raising=False)
    if engine == "postgres":
        given: object = PostgresBackend(postgres_database, durable_acks=True, max_size=3)
    elif engine == "sqlite":
        given = SqliteBackend(str(tmp_path / "given.db"))
    else:
        given = MemoryBackend()
    app = App(backend=given)  # type: ignore[arg-type]
    try:
        app.admin.migrate()
        first = app.send("t", {}, queue="q").id
        app.close()
        second = app.send("t", {}, queue="q").id
        assert app.backend is not given and app.backend.engine == engine
        if engine == "memory":
            with pytest.raises(JobNotFoundError):  # a private database dies with its close, as memory:// does
                app.job(first)
        else:
            assert app.job(first) is not None
            if engine == "postgres":
                assert app.backend._durable_acks and app.backend._sizes == (1, 3)  # type: ignore[attr-defined]
        assert app.job(second) is not None
        assert not (tmp_path / "conveyor.db").exists()
    finally:
        app.close()
