"""Reading an input table (bulk enqueue's ``--input``, reconcile's ``--business``) from files.

Spark's CSV reader, left to its defaults, gets several things silently wrong, each of which would
enqueue wrong jobs: it splits a quoted field holding a line break into phantom rows and keeps RFC 4180's
doubled quotes (``""``) doubled; it applies the first file's header to every file, by position, so the
values of a file whose columns are in another order land in the wrong columns; it reads every file of a
directory as CSV (a README's lines become rows); it turns bytes that are not UTF-8 into U+FFFD, so
distinct keys can collide (in Parquet strings too); and it renames a header's repeated column (``v,v``
becomes ``v1,v2``), and it reads columns that two files spell in another case (``Key``, ``key``) as one.
Hence: RFC 4180 options, files grouped by their own header and joined by column name, only files of the
input's format, a UTF-8 and header check of CSV and a check of column spellings before Spark reads
anything, and a UTF-8 check of Parquet's strings in Spark.
"""

from __future__ import annotations

import bz2
import codecs
import csv
import gzip
import io
import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, BinaryIO, cast

from conveyor.pipeline.errors import PipelineError

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

#: The formats read, by file name suffix (in any case: .CSV and .Parquet too).
FORMATS = {".csv": "csv", ".parquet": "parquet"}
#: Compressed CSV read (Spark decompresses them by suffix, in any case; Python does for the checks).
CSV_COMPRESSIONS = (".gz", ".bz2")
#: Compressed CSV refused (never skipped without a word): neither Python's standard library nor
#: every Spark build reads them.
OTHER_COMPRESSIONS = (".zst", ".lz4", ".snappy", ".deflate", ".xz", ".zip", ".z", ".lzo", ".br")
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
        kind = format_of(root)
        if kind is None:
            raise PipelineError(f"input {root}: expected a Parquet or CSV file (.parquet, .csv, .csv.gz, .csv.bz2)")
        return InputFiles(root, kind, [root])
    found: dict[str, list[Path]] = {kind: [] for kind in FORMATS.values()}
    skipped: list[Path] = []
    for file in sorted(p for p in root.rglob("*") if p.is_file()):
        if any(part.startswith(("_", ".")) for part in file.relative_to(root).parts):
            continue
        kind = format_of(file)
        (found[kind] if kind is not None else skipped).append(file)
    if found["csv"] and found["parquet"]:
        raise PipelineError(
            f"input {root} holds both CSV and Parquet files ({found['csv'][0].name}, {found['parquet'][0].name}): "
            "point it at the files of one format"
        )
    for kind, files in found.items():
        if files:
            return InputFiles(root, kind, files, skipped)
    raise PipelineError(f"input {root}: expected Parquet or CSV files (.parquet, .csv, .csv.gz, .csv.bz2), found none")


def format_of(file: Path) -> str | None:
    """The format of ``file`` by its name (None: neither). Suffixes match in any case, as users name
    files (``.CSV``); a CSV compressed other than by gzip or bzip2 is refused (:class:`PipelineError`)
    rather than skipped."""
    suffixes = [s.lower() for s in file.suffixes]
    if not suffixes:
        return None
    if suffixes[-1] in FORMATS:
        return FORMATS[suffixes[-1]]
    if len(suffixes) >= 2 and suffixes[-2] == ".csv":
        if suffixes[-1] in CSV_COMPRESSIONS:
            return "csv"
        if suffixes[-1] in OTHER_COMPRESSIONS:
            raise PipelineError(
                f"{file}: CSV compressed as {file.suffix} is not read; decompress it, or compress it with gzip or bzip2"
            )
    return None


def _open_csv(file: Path) -> BinaryIO:
    """``file``'s bytes, decompressed when its name says gzip or bzip2."""
    suffix = file.suffix.lower()
    if suffix == ".gz":
        return cast("BinaryIO", gzip.GzipFile(file, "rb"))
    if suffix == ".bz2":
        return cast("BinaryIO", bz2.BZ2File(file, "rb"))
    return open(file, "rb")


def csv_headers(files: InputFiles) -> dict[tuple[str, ...], list[Path]]:
    """The CSV files grouped by their header row, after checking that every file is UTF-8.

    Raises :class:`PipelineError` naming the first file with bytes that are not UTF-8, how many of its
    lines hold such bytes and the first of them: Spark would turn them into U+FFFD, and two keys that
    differ only there would become one. Also raises it for a header naming one column twice (in any
    case, as Spark compares names), which Spark would rename (``v,v`` to ``v1,v2``), and for input
    without any header row. Reads each file once, on this machine."""
    groups: dict[tuple[str, ...], list[Path]] = {}
    for file in files.files:
        try:
            _check_utf8(file)
            with _open_csv(file) as raw, io.TextIOWrapper(raw, encoding="utf-8-sig", newline="") as f:
                header = next(csv.reader(f), None)
        except (OSError, EOFError) as exc:
            # A truncated or mislabelled .gz/.bz2 file.
            raise PipelineError(f"{file}: cannot be read: {exc}") from None
        if header is not None:
            _check_header(file, header)
            groups.setdefault(tuple(header), []).append(file)
    if not groups:
        raise PipelineError(f"input {files.path}: no CSV file has a header row (the first row names the columns)")
    return groups


def _check_header(file: Path, header: list[str]) -> None:
    what = "schema" if file.suffix.lower() == ".parquet" else "header"
    seen: dict[str, str] = {}
    for i, given in enumerate(header):
        name = given or f"_c{i}"  # as Spark names a column without a name
        folded = name.lower()
        if folded in seen:
            twice = repr(name) if seen[folded] == name else f"{seen[folded]!r} and {name!r}"
            raise PipelineError(
                f"{file}: the {what} names column {twice} twice (Spark compares names in any case); give each "
                "column its own name"
            )
        seen[folded] = name


def known_columns(files: InputFiles, headers: dict[tuple[str, ...], list[Path]] | None) -> list[str]:
    """The columns of the input as far as they can be told without Spark: CSV headers (:func:`csv_headers`)
    or Parquet schemas (each file's footer), plus the ``key=value`` directories Spark reads as columns.

    Raises :class:`PipelineError` when two files spell a column differently only in case (``Key`` and
    ``key``): Spark compares names in any case and reads them as one column, so the values of two columns
    would be mixed without a word, and a column named in one spelling is not found in the other."""
    named: list[tuple[str, Path]] = []  # each column with a file that names it
    if headers is not None:
        named = [(name or f"_c{i}", group[0]) for header, group in headers.items() for i, name in enumerate(header)]
    else:
        import pyarrow.parquet as pq

        for file in files.files:
            try:
                names = pq.read_schema(file).names
            except Exception as exc:
                raise PipelineError(f"{file}: not a Parquet file Spark could read: {exc}") from None
            _check_header(file, names)  # Spark refuses them too, but after starting and naming no file
            named += [(name, file) for name in names]
    if files.path.is_dir():
        for file in files.files:
            named += [(part.split("=", 1)[0], file) for part in file.relative_to(files.path).parts[:-1] if "=" in part]
    spelled: dict[str, tuple[str, Path]] = {}
    for name, file in named:
        first, where = spelled.setdefault(name.lower(), (name, file))
        if first != name:
            raise PipelineError(
                f"input {files.path}: column {first!r} ({where}) and column {name!r} ({file}) differ only in case; "
                "Spark compares names in any case and would read them as one column: give them one spelling"
            )
    return list(dict.fromkeys(name for name, _ in named))


def _check_utf8(file: Path) -> None:
    decoder = codecs.getincrementaldecoder("utf-8")()
    try:
        with _open_csv(file) as f:
            while chunk := f.read(_CHUNK):
                decoder.decode(chunk)
            decoder.decode(b"", final=True)
        return
    except UnicodeDecodeError:
        pass
    bad, first = 0, 0
    with _open_csv(file) as f:
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
    column some files lack is null in their rows. Parquet strings (nested ones too) are checked to be
    UTF-8 (:func:`check_parquet_utf8`, one Spark pass over the string columns). Columns that files spell
    differently only in case are refused (:func:`known_columns`)."""
    from functools import reduce

    # The files are named one by one, as list_input found them (subdirectories included): given the
    # directory, Spark reads only its own files and key=value partition directories, so a file in a
    # plain subdirectory was read or not depending on the other files' headers (a sweep found it).
    root = str(files.path.absolute())
    groups = (headers if headers is not None else csv_headers(files)) if files.format == "csv" else None
    known_columns(files, groups)  # two spellings of one column in any case are refused before Spark reads
    if files.format == "parquet":
        reader = spark.read.option("mergeSchema", "true")
        if files.path.is_dir():
            reader = reader.option("basePath", root)  # partition directories (key=value) still give columns
        df = reader.parquet(*[str(p.absolute()) for p in files.files])
        check_parquet_utf8(df)
        return df
    assert groups is not None
    reader = spark.read.options(**CSV_OPTIONS)
    if files.path.is_dir():
        reader = reader.option("basePath", root)
    frames = [reader.csv([str(p.absolute()) for p in group]) for group in groups.values()]
    return reduce(lambda a, b: a.unionByName(b, allowMissingColumns=True), frames)


def check_parquet_utf8(df: DataFrame) -> None:
    """Raise :class:`PipelineError` if a string of ``df`` (read from Parquet) holds bytes that are not
    UTF-8, naming how many rows, and the first one's file, row in its file and column.

    Parquet stores strings as bytes and Spark does not check them: Python receives each bad byte as
    U+FFFD, so keys that differ only there became one job, and the rest were lost as duplicates."""
    from pyspark.sql import functions as F

    checks = string_checks(df, lambda s: ~F.is_valid_utf8(s))
    if not checks:
        return
    # A null test (a null string is no bad string) keeps the expressions three-valued-logic safe.
    which = F.coalesce(*[F.when(F.coalesce(check, F.lit(False)), F.lit(name)) for name, check in checks])
    # A data column named _metadata hides Spark's file metadata: the error then names no file or row.
    hidden = "_metadata" in df.columns
    found = (
        df.select(
            which.alias("column"),
            (F.lit(None).cast("string") if hidden else F.col("_metadata.file_path")).alias("file"),
            (F.lit(None).cast("long") if hidden else F.col("_metadata.row_index")).alias("row"),
        )
        .where(F.col("column").isNotNull())
        .agg(F.count(F.lit(1)).alias("n"), F.min(F.struct("file", "row", "column")).alias("first"))
        .collect()[0]
    )
    if found["n"]:
        first = found["first"]
        from urllib.parse import unquote, urlparse

        where = "the input" if first["file"] is None else unquote(urlparse(first["file"]).path)
        row = "" if first["row"] is None else f"row {first['row'] + 1} of that file, "
        raise PipelineError(
            f"{where}: {found['n']:,} rows hold strings that are not UTF-8 (the first: {row}column "
            f"{first['column']!r}); nothing was read. Write them as UTF-8, or as binary columns"
        )


def string_checks(
    df: DataFrame, is_bad: Callable[[Any], Any], columns: Sequence[str] | None = None
) -> list[tuple[str, Any]]:
    """For each column of ``df`` (or of ``columns``) that holds strings, nested ones too (structs,
    arrays, maps), its name and an expression true when one of its strings is ``is_bad`` (a function
    of a string column to a boolean column); null where the value is null."""
    from pyspark.sql import functions as F
    from pyspark.sql.types import ArrayType, DataType, MapType, StringType, StructType

    from conveyor.pipeline._keys import col

    def has_strings(kind: DataType) -> bool:
        if isinstance(kind, StructType):
            return any(has_strings(f.dataType) for f in kind.fields)
        if isinstance(kind, ArrayType):
            return has_strings(kind.elementType)
        if isinstance(kind, MapType):
            return has_strings(kind.keyType) or has_strings(kind.valueType)
        return isinstance(kind, StringType)

    def bad(column: Any, kind: DataType) -> Any:
        """An expression true when ``column`` (of a type that has strings) holds a bad one."""
        if isinstance(kind, StringType):
            return is_bad(column)
        if isinstance(kind, StructType):
            return _any([bad(column[f.name], f.dataType) for f in kind.fields if has_strings(f.dataType)])
        if isinstance(kind, ArrayType):
            return F.exists(column, lambda x: bad(x, kind.elementType))
        assert isinstance(kind, MapType)
        parts = []
        if has_strings(kind.keyType):
            parts.append(F.exists(F.map_keys(column), lambda x: bad(x, kind.keyType)))
        if has_strings(kind.valueType):
            parts.append(F.exists(F.map_values(column), lambda x: bad(x, kind.valueType)))
        return _any(parts)

    wanted = set(df.columns if columns is None else columns)
    return [
        (f.name, bad(col(f.name), f.dataType)) for f in df.schema.fields if f.name in wanted and has_strings(f.dataType)
    ]


def _any(parts: list[Any]) -> Any:
    from functools import reduce

    return reduce(lambda a, b: a | b, parts)
