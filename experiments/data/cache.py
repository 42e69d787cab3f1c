"""Where downloads and derived files live, and how they are written safely.

Everything is written to a temporary name and renamed into place, so processes that race on a
cold cache (DDP ranks, parallel sweep jobs) each produce a complete file and the last rename
wins with identical content; a reader never sees a half-written file.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

ENV_VAR = "MESH_CACHE_DIR"


def cache_root(cache_dir: str | os.PathLike[str] | None = None) -> Path:
    """``cache_dir``, else ``$MESH_CACHE_DIR``, else ``~/.cache/mesh-recursive``."""
    if cache_dir:
        return Path(cache_dir).expanduser()
    if os.environ.get(ENV_VAR):
        return Path(os.environ[ENV_VAR]).expanduser()
    return Path.home() / ".cache" / "mesh-recursive"


def digest(*parts: object, length: int = 16) -> str:
    """A short stable hex key for cache paths (sha1 of the parts' reprs)."""
    return hashlib.sha1("\x1f".join(repr(p) for p in parts).encode()).hexdigest()[:length]


def sha256_file(path: str | os.PathLike[str]) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


@contextmanager
def atomic_path(path: Path) -> Iterator[Path]:
    """Yield a temporary path next to ``path``; on success rename it onto ``path``."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp_name = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    os.close(fd)
    tmp = Path(tmp_name)
    tmp.chmod(0o644)  # mkstemp makes it private; cached files are shared like any download
    try:
        yield tmp
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)


@contextmanager
def atomic_dir(path: Path) -> Iterator[Path]:
    """Yield a temporary folder next to ``path``; on success it becomes ``path``.

    If another process published ``path`` first, its copy is kept and ours is discarded.
    """
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent))
    tmp.chmod(0o755)
    try:
        yield tmp
        try:
            os.rename(tmp, path)
        except OSError:
            if not path.is_dir():
                raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
