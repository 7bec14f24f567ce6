"""Rows as records: a statement's select list names its columns as the fields of the dataclass it
returns (``Delivery``, ``JobRecord``, ...), so that adding a field cannot shift the others.

psycopg's ``class_row`` maps every row by name, building a dict of keyword arguments per row; where
the columns are the record's fields in order (checked once per statement, not per row), the row is
passed positionally instead. For an acquire of 100 jobs: 15 -> 10 µs of the client's CPU per row
with the dataclass's own ``__init__``, less again with a hand-written one (``Delivery``'s)."""

from __future__ import annotations

from dataclasses import fields
from typing import Any, TypeVar

from psycopg.rows import BaseRowFactory, RowMaker, class_row

R = TypeVar("R")


def record_row(record: type[R]) -> BaseRowFactory[R]:
    """A row factory building ``record``: positionally when the columns are its fields in order,
    else by name (as ``class_row``)."""
    names = tuple(f.name for f in fields(record))  # type: ignore[arg-type]
    by_name = class_row(record)

    def positional(values: Any) -> R:
        return record(*values)

    def factory(cursor: Any) -> RowMaker[R]:
        description = cursor.description
        if description is not None and tuple(column.name for column in description) == names:
            return positional
        return by_name(cursor)

    return factory
