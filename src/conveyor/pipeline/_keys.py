"""Business keys as text, the same way in Spark (reconcile) and in Python (bulk enqueue), and
column references that take any column name.

A key is matched against a job's idempotency key, which is text, so every key column is turned into
text by one rule. A float column's whole numbers are their integer's text (``1.0`` is ``"1"``, as an
integer column's ``1`` is), so that a key read as a double from Parquet finds the job its integer
enqueued. Any other float (NaN, infinite, fractional, or past 2^53, where a double is no longer exact)
is not a usable key, nor is a null or an empty text: such a record matches no job and is never enqueued.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from pyspark.sql import Column, DataFrame

#: Past this a double no longer holds every whole number exactly: 2^53 + 1 reads back as 2^53.
EXACT_FLOAT_LIMIT = 2**53


def col(name: str) -> Column:
    """The column named ``name``, whatever it holds: Spark reads ``a.b`` in ``F.col`` as field ``b`` of
    struct ``a``, so the name is quoted with backticks (a backtick in it doubled)."""
    from pyspark.sql import functions as F

    return F.col("`" + name.replace("`", "``") + "`")


def key_text(value: Any) -> str | None:
    """A key value as its text, or None when it is not a usable key (see the module docstring)."""
    if value is None:
        return None
    if isinstance(value, float):
        if math.isfinite(value) and value.is_integer() and abs(value) < EXACT_FLOAT_LIMIT:
            return str(int(value))
        return None
    text = str(value)
    return text or None


def key_column_text(df: DataFrame, name: str) -> Column:
    """:func:`key_text` as a Spark expression over column ``name`` of ``df`` (null: no usable key)."""
    from pyspark.sql import functions as F
    from pyspark.sql.types import DoubleType, FloatType

    column = col(name)
    if isinstance(df.schema[name].dataType, FloatType | DoubleType):
        # CASE evaluates the cast only for whole numbers in range, so ANSI mode has nothing to refuse.
        whole = ~F.isnan(column) & (F.abs(column) < EXACT_FLOAT_LIMIT) & ((column % 1) == 0)
        return F.when(whole, column.cast("bigint").cast("string"))
    text = column.cast("string")
    return F.when(text != "", text)
