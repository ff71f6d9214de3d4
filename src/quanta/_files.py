"""Writing files safely: a failed write leaves the previous file intact."""

from __future__ import annotations

import json
import os
import tempfile
from collections.abc import Callable
from typing import Any

__all__ = ["atomic_write", "read_json"]


def atomic_write(path: str | os.PathLike, write: Callable[[str], None]) -> None:
    """Call ``write(tmp_path)`` on a temporary file beside ``path``, then rename it over ``path``.

    The rename is atomic on POSIX and Windows, so readers see either the old
    file or the whole new one; if ``write`` raises, the temporary file is
    removed and ``path`` is untouched.

    >>> import pathlib, tempfile
    >>> p = pathlib.Path(tempfile.mkdtemp()) / "a.txt"
    >>> atomic_write(p, lambda tmp: pathlib.Path(tmp).write_text("new"))
    >>> p.read_text()
    'new'
    """
    path = os.fspath(path)
    directory = os.path.dirname(os.path.abspath(path))
    fd, tmp = tempfile.mkstemp(prefix=".quanta-", suffix=".tmp", dir=directory)
    os.close(fd)
    try:
        write(tmp)
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise


def read_json(path: str | os.PathLike, what: str = "JSON") -> Any:
    """Parse the JSON file ``path`` (JSON only: nothing in the file runs).

    A missing file is a FileNotFoundError, undecodable content a ValueError;
    both name the file and ``what`` it should have been.
    """
    path = os.fspath(path)
    if not os.path.isfile(path):
        raise FileNotFoundError(f"{what} file not found: {path}")
    try:
        with open(path, encoding="utf-8") as f:
            return json.load(f)
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise ValueError(f"{path} is not a JSON {what} file: {e}") from None
