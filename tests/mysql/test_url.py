"""connect_kwargs: the one reading of a mysql:// URL, shared by the backend and the test fixtures."""

from __future__ import annotations

import pytest

from conveyor._errors import ConfigurationError
from conveyor.backends.mysql._url import connect_kwargs


def test_a_full_url_gives_every_argument() -> None:
    assert connect_kwargs("mysql://root:pw@127.0.0.1:3307/test?connect_timeout=4") == {
        "host": "127.0.0.1",
        "port": 3307,
        "user": "root",
        "password": "pw",
        "database": "test",
        "connect_timeout": 4,
    }


def test_the_port_defaults_to_3306_and_the_password_to_empty() -> None:
    assert connect_kwargs("mysql://root@db.example/queue") == {
        "host": "db.example",
        "port": 3306,
        "user": "root",
        "password": "",
        "database": "queue",
    }


def test_without_a_user_pymysql_chooses_it() -> None:
    assert "user" not in connect_kwargs("mysql://127.0.0.1/test")


def test_an_ipv6_host_is_written_in_brackets() -> None:
    assert connect_kwargs("mysql://root@[::1]:3306/test")["host"] == "::1"


@pytest.mark.parametrize(
    ("url", "key", "value"),
    [
        ("mysql://u:p%40s%3As%2Fw%23d%25@h/d", "password", "p@s:s/w#d%"),
        ("mysql://u:p@ss@h/d", "password", "p@ss"),  # up to the last '@', as redact_url reads it
        ("mysql://u:a:b@h/d", "password", "a:b"),
        ("mysql://j%C3%BCrgen@h/d", "user", "jürgen"),
        ("mysql://jürgen@h/d", "user", "jürgen"),
        ("mysql://u@h/caf%C3%A9", "database", "café"),
        ("mysql://u@h/a%2Fb", "database", "a/b"),
        ("mysql://u@h/%E2%80%AE", "database", "\u202e"),
    ],
)
def test_percent_escapes_are_decoded(url: str, key: str, value: str) -> None:
    assert connect_kwargs(url)[key] == value


@pytest.mark.parametrize(
    ("url", "reason"),
    [
        ("", "it is empty"),
        ("postgresql://u@h/d", "its scheme must be mysql://"),
        ("mysql+pymysql://u@h/d", "its scheme must be mysql://"),
        ("h:3306/d", "its scheme must be mysql://"),
        ("mysql:///d", "it has no host"),
        ("mysql://u:hunter2@/d", "it has no host"),
        ("mysql://u:hunter2@:3306/d", "it has no host"),
        ("mysql://h:99999/d", "port is not a number from 1 to 65535"),
        ("mysql://h:65536/d", "port is not a number from 1 to 65535"),
        ("mysql://h:0/d", "port is not a number from 1 to 65535"),
        ("mysql://h:abc/d", "port is not a number from 1 to 65535"),
        ("mysql://h:+1/d", "port is not a number from 1 to 65535"),
        ("mysql://h:-1/d", "port is not a number from 1 to 65535"),
        ("mysql://h:\uff11/d", "port is not a number from 1 to 65535"),
        ("mysql://u:hun/ter2@h/d", "port is not a number from 1 to 65535"),  # an unescaped '/' ends the host
        ("mysql://[::1/d", "not a valid address"),
        ("mysql://u@h", "names no database"),
        ("mysql://u@h/", "names no database"),
        ("mysql://u@h/a/b", "one database name"),
        ("mysql://u:hunter2@h/d#x", "fragment"),
        ("mysql://u:hunter2@h/d#", "fragment"),
        ("mysql://:hunter2@h/d", "a password but no user"),
        ("mysql://h/d?sslmode=require", "unknown option 'sslmode'"),
        ("mysql://u:hunter2@h/d?password=hunter2", "unknown option 'password'"),
        ("mysql://h/d?connect_timeout", "is not name=value pairs"),
        ("mysql://h/d?connect_timeout=0", "whole number of seconds"),
        ("mysql://h/d?connect_timeout=1.5", "whole number of seconds"),
        ("mysql://h/d?connect_timeout=1&connect_timeout=2", "given twice"),
        ("mysql://u:hun\x00ter2@h/d", "control character"),
        ("mysql://u:hunter2@h/d\x00", "control character"),
        ("mysql://u:hun%00ter2@h/d", "password holds a control character"),
        ("mysql://r%00oot@h/d", "user holds a control character"),
        ("mysql://u@h/d%00", "database name holds a control character"),
        ("mysql://u:hunter2@h/d%0a", "database name holds a control character"),
        ("mysql://ro\not:hunter2@h/d", "control character"),  # urlsplit would drop the newline: 'root'
        ("mysql://u:hunter2\t@h/d", "control character"),
        ("mysql://u:hun%FFter2@h/d", "password is not UTF-8 text"),
        ("mysql://%C3@h/d", "user is not UTF-8 text"),
        ("mysql://u\udcff@h/d", "user is not UTF-8 text"),  # a shell's byte that was not UTF-8
    ],
)
def test_a_malformed_url_is_refused_without_showing_its_password(url: str, reason: str) -> None:
    with pytest.raises(ConfigurationError, match="malformed MySQL URL") as caught:
        connect_kwargs(url)
    message = str(caught.value)
    assert reason in message
    assert not any(part in message for part in ("hunter2", "hun", "ter2"))
    # Nothing chained that a traceback would print, such as urlsplit's error quoting the port it read.
    assert caught.value.__cause__ is None
    assert caught.value.__context__ is None or caught.value.__suppress_context__
    assert "\n" not in message and "\x00" not in message


def test_a_url_that_is_not_a_string_is_refused() -> None:
    with pytest.raises(ConfigurationError, match="must be a string, got bytes"):
        connect_kwargs(b"mysql://h/d")  # type: ignore[arg-type]
