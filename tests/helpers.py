"""Running the project's command-line tools from tests.

:func:`run_tool` calls a console script's ``main(argv)`` in this process, as the script would run
it (its name in ``sys.argv[0]``, the environment and working folder given, stdout and stderr
captured, the exit code from the return value or ``SystemExit``): no interpreter start, no
second import of torch and Lightning. :func:`run_process` starts the real console script, for
what only a process shows: a signal, a kill, a mount namespace, what a fresh process imports.
"""

from __future__ import annotations

import contextlib
import importlib
import io
import os
import subprocess
import sys
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from importlib.metadata import entry_points
from pathlib import Path

BIN = Path(sys.executable).parent
# ``python -m experiments.data`` has no console script: its main is the module's
MODULES = {"experiments.data": "experiments.data.__main__:main"}


@dataclass(frozen=True)
class Ran:
    """What a tool did: its exit code and everything it printed (as ``subprocess.CompletedProcess``)."""

    returncode: int
    stdout: str
    stderr: str


def entry_point(tool: str) -> Callable[..., object]:
    """The function behind ``tool``: an installed console script (pyproject.toml's ``[project.scripts]``),
    or a module run with ``-m``."""
    if tool not in MODULES:
        (script,) = entry_points(group="console_scripts", name=tool)
    module, _, name = (MODULES.get(tool) or script.value).partition(":")
    return getattr(importlib.import_module(module), name)


@contextlib.contextmanager
def _as_a_process(tool: str, env: Mapping[str, str] | None, cwd: Path | None) -> Iterator[None]:
    argv, environ, folder = sys.argv, dict(os.environ), Path.cwd()
    sys.argv = [tool]
    if env is not None:
        os.environ.clear()
        os.environ.update(env)
    if cwd is not None:
        os.chdir(cwd)
    try:
        yield
    finally:
        sys.argv = argv
        os.environ.clear()
        os.environ.update(environ)
        os.chdir(folder)


def run_tool(tool: str, *args: str, env: Mapping[str, str] | None = None, cwd: Path | None = None) -> Ran:
    """``tool``'s ``main(argv)`` in this process; ``env`` replaces the environment for the call."""
    main = entry_point(tool)
    out, err = io.StringIO(), io.StringIO()
    with _as_a_process(tool, env, cwd), contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            returned = main(list(args))
            code = returned if isinstance(returned, int) else 0
        except SystemExit as stop:
            if isinstance(stop.code, str):  # sys.exit("message"): printed, exit 1
                print(stop.code, file=sys.stderr)
            code = stop.code if isinstance(stop.code, int) else (0 if stop.code is None else 1)
    return Ran(code, out.getvalue(), err.getvalue())


def run_process(
    tool: str,
    *args: str,
    env: Mapping[str, str] | None = None,
    cwd: Path | None = None,
    prefix: tuple[str, ...] = (),
    timeout: float = 600,
) -> Ran:
    """The real console script (``python -m`` for a module) in a process of its own. The timeout
    only stops a hang, never a slow machine: a refusal has taken 32 s under load."""
    command = [sys.executable, "-m", tool] if tool in MODULES else [str(BIN / tool)]
    done = subprocess.run([*prefix, *command, *args], capture_output=True, text=True, env=env, cwd=cwd, timeout=timeout)
    return Ran(done.returncode, done.stdout, done.stderr)


def server_environment() -> dict[str, str]:
    """The environment of a test's ``mlflow server``: without MLflow 3's job runner (a huey consumer
    of its own, with workers and periodic tasks, for GenAI jobs the tests never submit): 6-7 CPU-s
    less per server over a minute."""
    return {**os.environ, "MLFLOW_SERVER_ENABLE_JOB_EXECUTION": "false"}
