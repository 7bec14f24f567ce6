"""Reading an input table (bulk enqueue's ``--input``, reconcile's ``--business``) from files.

Spark's CSV reader, left to its defaults, gets several things silently wrong, each of which would
enqueue wrong jobs: it splits a quoted field holding a line break into phantom rows and keeps RFC 4180's
doubled quotes (``""``) doubled; it applies the first file's header to every file, by position, so the
values of a file whose columns are in another order land in the wrong columns; it reads every file of a
directory as CSV (a README's lines become rows); and it turns bytes that are not UTF-8 into U+FFFD, so
distinct keys can collide. Hence: RFC 4180 options, files grouped by their own header and joined by
column name, only files of the input's format, and a UTF-8 check before Spark reads anything.
"""

from __future__ import annotations

import codecs
import csv
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from conveyor.pipeline.errors import PipelineError

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

#: The formats read, by file name suffix (case-sensitive, as Spark's pathGlobFilter is).
FORMATS = {".csv": "csv", ".parquet": "parquet"}
#: RFC 4180: a quoted field may hold line breaks, and a quote inside one is written twice.
CSV_OPTIONS = {"header": "true", "multiLine": "true", "quote": '"', "escape": '"'}
_CHUNK = 1 << 20


@dataclass(frozen=True, slots=True)
class InputFiles:
    """The files of an input path: ``format`` (csv or parquet), the ``files`` of that format read, and
    the ``skipped`` files of no format or another. Hidden files (a name starting with ``_`` or ``.``,
    as Spark writes ``_SUCCESS`` and ``.crc`` files) are neither: Spark itself never reads them."""

    path: Path
    format: str
    files: list[Path]
    skipped: list[Path] = field(default_factory=list)


def list_input(path: str | os.PathLike[str]) -> InputFiles:
    """The files an input path stands for. Raises :class:`PipelineError` for a path that does not
    exist, holds no CSV or Parquet file, or holds both (which one was meant cannot be told)."""
    root = Path(path)
    if not root.exists():
        raise PipelineError(f"input {root} does not exist")
    if root.is_file():
        kind = FORMATS.get(root.suffix)
        if kind is None:
            raise PipelineError(f"input {root}: expected a Parquet or CSV file (.parquet, .csv)")
        return InputFiles(root, kind, [root])
    found: dict[str, list[Path]] = {kind: [] for kind in FORMATS.values()}
    skipped: list[Path] = []
    for file in sorted(p for p in root.rglob("*") if p.is_file()):
        if any(part.startswith(("_", ".")) for part in file.relative_to(root).parts):
            continue
        kind = FORMATS.get(file.suffix)
        (found[kind] if kind is not None else skipped).append(file)
    if found["csv"] and found["parquet"]:
        raise PipelineError(
            f"input {root} holds both CSV and Parquet files ({found['csv'][0].name}, {found['parquet'][0].name}): "
            "point it at the files of one format"
        )
    for kind, files in found.items():
        if files:
            return InputFiles(root, kind, files, skipped)
    raise PipelineError(f"input {root}: expected Parquet or CSV files (.parquet, .csv), found none")


def csv_headers(files: InputFiles) -> dict[tuple[str, ...], list[Path]]:
    """The CSV files grouped by their header row, after checking that every file is UTF-8.

    Raises :class:`PipelineError` naming the first file with bytes that are not UTF-8, how many of its
    lines hold such bytes and the first of them: Spark would turn them into U+FFFD, and two keys that
    differ only there would become one. Reads each file once, on this machine."""
    groups: dict[tuple[str, ...], list[Path]] = {}
    for file in files.files:
        _check_utf8(file)
        with open(file, encoding="utf-8-sig", newline="") as f:
            header = next(csv.reader(f), None)
        if header is not None:
            groups.setdefault(tuple(header), []).append(file)
    return groups


def _check_utf8(file: Path) -> None:
    decoder = codecs.getincrementaldecoder("utf-8")()
    try:
        with open(file, "rb") as f:
            while chunk := f.read(_CHUNK):
                decoder.decode(chunk)
            decoder.decode(b"", final=True)
        return
    except UnicodeDecodeError:
        pass
    bad, first = 0, 0
    with open(file, "rb") as f:
        for number, line in enumerate(f, 1):
            try:
                line.decode("utf-8")
            except UnicodeDecodeError:
                bad, first = bad + 1, first or number
    raise PipelineError(
        f"{file}: {bad:,} lines hold bytes that are not UTF-8 (the first: line {first}); nothing was read. "
        "Re-encode the file as UTF-8 (iconv -f LATIN1 -t UTF-8, say)"
    )


def read_input(
    spark: SparkSession, files: InputFiles, headers: dict[tuple[str, ...], list[Path]] | None = None
) -> DataFrame:
    """The table of ``files`` (:func:`list_input`), columns matched by name across files.

    Parquet files are read with ``mergeSchema`` (a column only a later file has is kept; types that
    cannot merge are Spark's error). CSV files are read with RFC 4180 options, one read per distinct
    header (``headers``: :func:`csv_headers`, computed here when not given), joined by column name; a
    column some files lack is null in their rows."""
    from functools import reduce

    # The files are named one by one, as list_input found them (subdirectories included): given the
    # directory, Spark reads only its own files and key=value partition directories, so a file in a
    # plain subdirectory was read or not depending on the other files' headers (a sweep found it).
    root = str(files.path.absolute())
    if files.format == "parquet":
        reader = spark.read.option("mergeSchema", "true")
        if files.path.is_dir():
            reader = reader.option("basePath", root)  # partition directories (key=value) still give columns
        return reader.parquet(*[str(p.absolute()) for p in files.files])
    groups = headers if headers is not None else csv_headers(files)
    reader = spark.read.options(**CSV_OPTIONS)
    if files.path.is_dir():
        reader = reader.option("basePath", root)
    frames = [reader.csv([str(p.absolute()) for p in group]) for group in groups.values()]
    return reduce(lambda a, b: a.unionByName(b, allowMissingColumns=True), frames)
