"""PostgreSQL and bad input (issue 14): a statement no retry can fix is a BackendError, not an
outage; passwords never reach a message or a log line; a malformed URL fails at once."""

from __future__ import annotations

import logging
import random
import socket
import time
from datetime import UTC, datetime

import pytest
from _pg import insert, make_job
from psycopg.conninfo import conninfo_to_dict

from conveyor._errors import BackendError, BackendUnavailable, ConfigurationError
from conveyor.backends import open_backend
from conveyor.backends._redact import redact_url
from conveyor.backends.base import QueuesStatsParams
from conveyor.backends.postgres import PostgresBackend

SECRET = "S3cr3t-pw"


def _closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def test_an_index_entry_too_large_is_a_backend_error_not_unavailable(pg: PostgresBackend) -> None:
    """psycopg calls "index row size exceeds maximum" an OperationalError; treated as an outage, a
    worker retried it forever. The App refuses such names first; the seam must still say the truth."""
    rng = random.Random(7)
    queue = "".join(chr(0x4E00 + rng.randrange(20_000)) for _ in range(1500))  # ~4.5 kB, incompressible
    with pytest.raises(BackendError) as caught:
        insert(pg, make_job(queue=queue))
    assert not isinstance(caught.value, BackendUnavailable)
    assert "index row" in str(caught.value)


@pytest.mark.parametrize(
    "url",
    [
        f"postgresql://bob:{SECRET}@[::1/db",  # unclosed IPv6 bracket
        f"postgresql://bob:{SECRET}@localhost/db?bogus=1",  # unknown parameter
        f"postgresql://bob:{SECRET}%zz@localhost/db",  # bad percent-encoding
        f"postgresql://bob:{SECRET}@localhost:notaport/db",
        f"postgresql://bob:{SECRET}@localhost:99999/db",
    ],
)
def test_a_malformed_url_fails_at_once_without_its_password(url: str, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.DEBUG)
    started = time.monotonic()
    with pytest.raises(ConfigurationError, match="malformed PostgreSQL URL") as caught:
        open_backend(url)
    assert time.monotonic() - started < 1
    assert SECRET not in str(caught.value)
    assert "bob:***@" in str(caught.value)
    time.sleep(0.2)  # no pool was started that could log its attempts later
    assert SECRET not in caplog.text


def test_an_unsupported_scheme_does_not_show_the_password() -> None:
    with pytest.raises(ConfigurationError, match="unsupported database URL scheme 'oracle'") as caught:
        open_backend(f"oracle://bob:{SECRET}@localhost/db")
    assert SECRET not in str(caught.value)
    with pytest.raises(ConfigurationError, match="not a database URL") as caught:
        open_backend(f"bob:{SECRET}@localhost/db")
    assert SECRET not in str(caught.value)


def test_connection_failures_never_show_the_password(caplog: pytest.LogCaptureFixture) -> None:
    """The pool logs every failed attempt; the error names the reason; neither shows the password."""
    caplog.set_level(logging.DEBUG)
    # The CLI quiets the pool's logger (tests run `conveyor` in this process too): listen to it here.
    caplog.set_level(logging.DEBUG, logger="psycopg.pool")
    backend = PostgresBackend(f"postgresql://bob:{SECRET}@127.0.0.1:{_closed_port()}/db", connect_timeout=1.0)
    try:
        with pytest.raises(BackendUnavailable, match=r"no connection within 1s \(connection failed: .*refused"):
            backend.queues_stats(QueuesStatsParams(datetime.now(UTC)))
        # Even a driver that quoted the URL in a log line would not leak it.
        logging.getLogger("psycopg.pool").warning("error connecting to %s", f"postgresql://bob:{SECRET}@x/db")
        logging.getLogger("psycopg").warning(f"password={SECRET}")
    finally:
        backend.close()
    assert "error connecting" in caplog.text
    assert SECRET not in caplog.text


def test_a_wrong_password_is_reported_without_it(postgres_server_url: str, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.DEBUG)
    # The test server trusts local users, so authentication cannot fail; a missing database can.
    server = conninfo_to_dict(postgres_server_url)
    user, host, port = server.get("user", "postgres"), server.get("host", "127.0.0.1"), server.get("port", 5432)
    backend = PostgresBackend(f"postgresql://{user}:{SECRET}@{host}:{port}/no_such_database_here", connect_timeout=1.0)
    try:
        with pytest.raises(BackendUnavailable) as caught:
            backend.migrate()
    finally:
        backend.close()
    assert SECRET not in str(caught.value)
    assert SECRET not in caplog.text


@pytest.mark.parametrize(
    ("url", "shown"),
    [
        (f"postgresql://bob:{SECRET}@host:5432/db", "postgresql://bob:***@host:5432/db"),
        (f"postgresql://bob:p@ss:{SECRET}@host/db", "postgresql://bob:***@host/db"),
        (
            f"postgresql://host/db?user=bob&password={SECRET}&sslmode=off",
            "postgresql://host/db?user=bob&password=***&sslmode=off",
        ),
        (f"host=h user=bob password='{SECRET} x' dbname=d", "host=h user=bob password=*** dbname=d"),
        ("postgresql://bob@host/db", "postgresql://bob@host/db"),
        ("sqlite:///tmp/x.db", "sqlite:///tmp/x.db"),
    ],
)
def test_redact_url(url: str, shown: str) -> None:
    assert redact_url(url) == shown


def test_a_token_stored_with_an_expiry_past_the_year_9999_still_reads(pg: PostgresBackend) -> None:
    """create_token took 9999-12-31T23:59:59.999999-14:00 before session 45, which PostgreSQL stores in the year
    10000: after that every read of the token table failed ("timestamp too large"), every request of every
    token and `conveyor tokens list` with it. Such a row reads as the last instant Python has."""
    from datetime import timedelta, timezone

    from conveyor._tokens import hash_secret, mint
    from conveyor.backends.base import Token, TokenGetParams, TokensInsertParams

    token_id, secret, _ = mint()
    now = datetime.now(UTC)
    assert pg.tokens_insert(TokensInsertParams(Token(token_id, "far", "operator", None, hash_secret(secret), now)))
    with pg._connection("test") as conn:
        conn.execute(
            "UPDATE tokens SET expires_at = %s::timestamptz + interval '1 day' WHERE id = %s",
            (datetime.max.replace(tzinfo=timezone(-timedelta(hours=14))), token_id),
        )
    last = datetime.max.replace(tzinfo=UTC)
    assert [(t.name, t.expires_at) for t in pg.tokens_list()] == [("far", last)]
    got = pg.token_get(TokenGetParams(token_id))
    assert got is not None and got.expires_at == last
