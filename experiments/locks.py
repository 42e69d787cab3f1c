"""OS file locks (``flock``): released by the kernel when the holder exits, however it exits.

* :func:`file_lock` waits for a short critical section (creating the MLflow store);
* :class:`RunLock` claims a run directory (or a grid's) for one process and refuses a second
  one at once, naming the holder's PID.
"""

from __future__ import annotations

import fcntl
import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path


class RunInUseError(RuntimeError):
    """Another process holds the run directory; the message is one line."""


@contextmanager
def file_lock(path: Path) -> Iterator[None]:
    """Hold an exclusive lock on ``path`` (created if needed) for the ``with`` block."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


class RunLock:
    """``with RunLock(run_dir):`` one process at a time trains or resumes a run directory.

    The lock file ``<run_dir>/.lock`` holds the holder's PID for the message a second process
    gets; the lock itself is the ``flock``, so a holder killed with SIGKILL releases it.
    """

    FILE = ".lock"

    @classmethod
    def holder(cls, run_dir: Path) -> str | None:
        """The PID of the process that holds ``run_dir``'s lock ("unknown" when it wrote none);
        None when no process does."""
        path = run_dir / cls.FILE
        if not path.exists():
            return None
        with path.open() as handle:
            try:
                fcntl.flock(handle, fcntl.LOCK_SH | fcntl.LOCK_NB)
            except BlockingIOError:
                return handle.read().strip() or "unknown"
            fcntl.flock(handle, fcntl.LOCK_UN)
        return None

    def __init__(self, run_dir: Path, kind: str = "run") -> None:
        self.path = run_dir / self.FILE
        self.kind = kind  # what the directory holds, for the refusal: a run, a grid
        self._handle = None

    def __enter__(self) -> RunLock:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        handle = self.path.open("a+")
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            handle.seek(0)
            holder = handle.read().strip() or "unknown"
            handle.close()
            raise RunInUseError(
                f"{self.kind} {self.path.parent} is in use by PID {holder} (the same {self.kind} started twice); "
                "wait for it to finish or stop it, then run the command again"
            ) from None
        handle.seek(0)
        handle.truncate()
        handle.write(str(os.getpid()))
        handle.flush()
        self._handle = handle
        return self

    def __exit__(self, *exc: object) -> None:
        if self._handle is not None:
            fcntl.flock(self._handle, fcntl.LOCK_UN)
            self._handle.close()
            self._handle = None
