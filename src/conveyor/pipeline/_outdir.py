"""Output directories the pipeline may replace things in: its own, and nobody else's.

A command that replaces files in a directory (the report replaces its table folders) first claims
the directory: a new or empty one gets a marker file, one with the marker is an earlier run's
output, and anything else is refused, so a typo in ``--out`` never deletes somebody's files.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path

from conveyor.pipeline.errors import PipelineError


def claim_dir(
    path: str | os.PathLike[str], marker: str, what: str, *, legacy: Sequence[str] = (), ignore: Sequence[str] = ()
) -> Path:
    """Make ``path`` the output directory of ``what`` and return it.

    Accepted: a directory that does not exist (created), an empty one, or one holding ``marker``
    (or every file named in ``legacy``: the output of a version that wrote no marker). Names in
    ``ignore`` do not make a directory non-empty. The marker is written before anything else, so a
    run that stops half-way leaves a directory the next run recognises. Raises
    :class:`PipelineError` for a file, or a non-empty directory that is not the command's."""
    # Absolute: Spark resolves a relative path against the JVM's working directory, which need not
    # be this process's any more (a notebook or test that changed directory after Spark started).
    out = Path(path).absolute()
    if out.exists() and not out.is_dir():
        raise PipelineError(f"--out {out}: not a directory")
    if out.is_dir() and not (out / marker).exists():
        entries = [p.name for p in out.iterdir() if p.name not in ignore]
        ours = bool(legacy) and all((out / name).exists() for name in legacy)
        if entries and not ours:
            raise PipelineError(
                f"--out {out}: the directory is not empty and was not written by {what}; "
                "give a new or empty directory (nothing was changed)"
            )
    try:
        out.mkdir(parents=True, exist_ok=True)
        (out / marker).touch()
    except OSError as exc:
        raise PipelineError(f"--out {out}: {exc.strerror or exc}") from None
    return out
