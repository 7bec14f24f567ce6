"""The ``backend`` fixture: every conformance test runs once per engine."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from conveyor.backends import open_backend
from conveyor.backends.base import Backend


@pytest.fixture
def backend(database_url: str) -> Iterator[Backend]:
    b = open_backend(database_url)
    b.migrate()
    try:
        yield b
    finally:
        b.close()
