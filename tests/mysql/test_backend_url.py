"""The MySQL backend opens what its URL names, options included."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from conveyor.backends import open_backend


def test_a_connect_timeout_in_the_url_is_used(mysql_database: str) -> None:
    # Before: the backend passed its own connect_timeout beside the URL's, and every connection failed
    # with a TypeError ("got multiple values for keyword argument").
    backend = open_backend(f"{mysql_database}?connect_timeout=3")
    try:
        now = backend.database_now()
        assert now is not None and abs(now - datetime.now(UTC)) < timedelta(seconds=60)
    finally:
        backend.close()
