"""Writing files safely: a failed write leaves the previous file intact."""

from __future__ import annotations

import json
import os
import secrets
import stat
from collections.abc import Callable
from typing import Any

__all__ = ["atomic_write", "output_directory", "read_json", "write_bytes", "write_json"]


def atomic_write(path: str | os.PathLike, write: Callable[[str], None]) -> None:
    """Call ``write(tmp_path)`` on a temporary file beside ``path``, then rename it over ``path``.

    The rename is atomic on POSIX and Windows, so readers see either the old
    file or the whole new one; if ``write`` raises, the temporary file is
    removed and ``path`` is untouched. The new file is flushed to disk
    before the rename (so a crash cannot leave an empty file under the
    name), and gets the permissions ``open(path, "w")`` would give it: an
    existing file's, else ``0o666`` less the umask.

    >>> import pathlib, tempfile
    >>> p = pathlib.Path(tempfile.mkdtemp()) / "a.txt"
    >>> atomic_write(p, lambda tmp: pathlib.Path(tmp).write_text("new"))
    >>> p.read_text()
    'new'
    """
    path = os.fspath(path)
    directory = os.path.dirname(os.path.abspath(path))
    tmp = _create_temp(directory)
    try:
        try:
            os.chmod(tmp, stat.S_IMODE(os.stat(path).st_mode))  # an overwrite keeps the permissions
        except FileNotFoundError:
            pass
        write(tmp)
        fd = os.open(tmp, os.O_RDWR)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise
    _fsync_directory(directory)


def output_directory(path: Any, name: str = "results_dir") -> str:
    """``path`` as an absolute directory, created if missing; TypeError (not a path) or ValueError (an existing
    file) naming the argument ``name``."""
    if not isinstance(path, (str, os.PathLike)):
        raise TypeError(f"{name} must be a path (str or os.PathLike), got {type(path).__name__}")
    path = os.path.abspath(os.fspath(path))
    if os.path.exists(path) and not os.path.isdir(path):
        raise ValueError(f"{name} {path!r} exists and is not a directory")
    os.makedirs(path, exist_ok=True)
    return path


def write_bytes(path: str | os.PathLike, data: bytes | str) -> None:
    """Write ``data`` (text as UTF-8) to ``path`` atomically, creating its directory."""
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    raw = data.encode("utf-8") if isinstance(data, str) else data

    def write(tmp: str) -> None:
        with open(tmp, "wb") as f:
            f.write(raw)
    atomic_write(path, write)


def write_json(path: str | os.PathLike, data: Any, indent: int = 4) -> None:
    """``data`` as indented JSON at ``path``, atomically (its directory created)."""
    write_bytes(path, json.dumps(data, indent=indent))


def _create_temp(directory: str) -> str:
    """A new empty file ``.quanta-<random>.tmp`` in ``directory``, created with mode 0o666 less the umask.

    (``tempfile.mkstemp`` would create it 0o600, and the rename would pass that on to ``path``.)
    """
    for _ in range(100):
        tmp = os.path.join(directory, f".quanta-{secrets.token_hex(8)}.tmp")
        try:
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666)
        except FileExistsError:  # pragma: no cover - 64 random bits
            continue
        os.close(fd)
        return tmp
    raise FileExistsError(f"could not create a temporary file in {directory}")  # pragma: no cover


def _fsync_directory(directory: str) -> None:
    """Flush the rename itself to disk (POSIX; a no-op where directories cannot be opened)."""
    if not hasattr(os, "O_DIRECTORY"):  # pragma: no cover - Windows
        return
    try:
        fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY)
    except OSError:  # pragma: no cover
        return
    try:
        os.fsync(fd)
    except OSError:  # pragma: no cover - some file systems refuse fsync on directories
        pass
    finally:
        os.close(fd)


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
    except RecursionError:  # json recurses once per nesting level: "[[[[..." 100k deep
        raise ValueError(f"{path} is not a JSON {what} file: nested too deeply") from None
