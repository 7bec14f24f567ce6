"""The MySQL / MariaDB backend: InnoDB tables on a server, through PyMySQL (the ``mysql`` extra).

See :class:`MysqlBackend`. Its SQL lives in ``sql/queries.sql`` (named statements) and
``sql/NNNN_*.sql`` (migrations)."""

from __future__ import annotations

from conveyor.backends.mysql._backend import MysqlBackend

__all__ = ["MysqlBackend"]
