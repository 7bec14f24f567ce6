"""A sequence whose items are built from another's, each when it is first read, and then kept.

The producer maps messages (or ``Task.delay_many``'s payloads) to rows this way: built lazily, a row
is encoded while PostgreSQL's COPY still inserts the rows before it, instead of before the first row
leaves; kept, so that a row read twice is the same row (the same minted id)."""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from typing import Generic, TypeVar, overload

T = TypeVar("T")
U = TypeVar("U")


class Lazy(Sequence[U], Generic[T, U]):
    """``build`` applied to each item of ``source``, on first read. An exception of ``build``
    propagates to the reader (the backend's transaction then rolls back); :attr:`failed_at` then
    names the item it was raised for."""

    __slots__ = ("_build", "_built", "_source", "failed_at")

    def __init__(self, build: Callable[[T], U], source: Sequence[T]) -> None:
        self._build = build
        self._source = source
        self._built: list[U] = []
        #: The index of the item whose build raised, if one did.
        self.failed_at: int | None = None

    def __len__(self) -> int:
        return len(self._source)

    def _build_to(self, stop: int) -> None:
        built, build, source = self._built, self._build, self._source
        for i in range(len(built), min(stop, len(source))):
            try:
                built.append(build(source[i]))
            except BaseException:
                self.failed_at = i
                raise

    @overload
    def __getitem__(self, index: int) -> U: ...
    @overload
    def __getitem__(self, index: slice) -> Sequence[U]: ...
    def __getitem__(self, index: int | slice) -> U | Sequence[U]:
        if isinstance(index, slice) or index < 0:
            self._build_to(len(self._source))
        else:
            self._build_to(index + 1)
        return self._built[index]

    def __iter__(self) -> Iterator[U]:
        built, build = self._built, self._build
        for i, item in enumerate(self._source):
            if i == len(built):
                try:
                    built.append(build(item))
                except BaseException:
                    self.failed_at = i
                    raise
            yield built[i]
