"""Files written atomically: readers (and a resumed batch) see the old file or the new one,
never a part of one."""
from __future__ import annotations

import io
import os
import secrets
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator


@contextmanager
def atomic_open(path: Path, mode: str = "w", **kwargs) -> Iterator[io.IOBase]:
    """Open a temporary file beside ``path`` for writing; on a clean exit it replaces ``path``
    (``os.replace``: readers see the old file or the new one, never a part), on an exception it
    is removed and the exception propagates, leaving any old ``path`` untouched. Creates the
    parent folder. ``mode`` is ``"w"`` (text, UTF-8 unless ``encoding`` is given) or ``"wb"``."""
    if mode not in ("w", "wb"):
        raise ValueError(f"atomic_open writes only ('w' or 'wb'), not {mode!r}")
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    if mode == "w":
        kwargs.setdefault("encoding", "utf-8")
    # a hidden name in the same folder (os.replace is atomic only within one file system);
    # opened with "x" so the umask applies as for any other report file
    tmp = path.with_name(f".{path.name}.{os.getpid()}.{secrets.token_hex(4)}.tmp")
    try:
        with open(tmp, mode.replace("w", "x"), **kwargs) as f:
            yield f
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def atomic_write(path: Path, data: str | bytes) -> Path:
    """Write ``data`` (text as UTF-8) to ``path`` atomically (see :func:`atomic_open`);
    return ``path``."""
    with atomic_open(path, "wb" if isinstance(data, bytes) else "w") as f:
        f.write(data)
    return Path(path)


# --------------------------------------------------------------------------- small helpers
