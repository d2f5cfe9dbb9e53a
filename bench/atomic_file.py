"""Files that are never seen half written: write a temporary file beside the target, then
``os.replace`` it in.

Used for every file a run folder holds that is rewritten whole (meta.json, rows.parquet): a
reader, or a crash at any point, sees the old file or the new one, never part of one.
"""

from __future__ import annotations

import os
import tempfile
from contextlib import contextmanager
from pathlib import Path

__all__ = ["replacing", "write_text"]


@contextmanager
def replacing(path):
    """Yield the name of a temporary file in ``path``'s folder (mode 0644) for the caller to
    write; when the block ends normally the file is fsync'ed and moved onto ``path``, else it is
    removed and ``path`` is untouched. Same folder, so ``os.replace`` is one atomic rename."""
    path = Path(path)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    os.close(fd)
    try:
        os.chmod(tmp, 0o644)  # mkstemp makes 0600
        yield tmp
        with open(tmp, "rb") as fh:
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except FileNotFoundError:
            pass
        raise


def write_text(path, text: str) -> None:
    """Write ``text`` to ``path`` through :func:`replacing`."""
    with replacing(path) as tmp, open(tmp, "w", newline="", encoding="utf-8") as fh:
        fh.write(text)
