"""What every console script shares: help text as plain text, and ``--version``.

Docstrings are written for Sphinx (````code````, ``:func:`name```); a terminal shows them as
plain text. Standard library only, so a CLI's ``--help`` and ``--version`` import nothing heavy.
"""

from __future__ import annotations

import argparse
import re
import subprocess
from collections.abc import Sequence
from importlib import metadata
from pathlib import Path

DISTRIBUTION = "mesh-recursive"
SOURCE_ROOT = Path(__file__).resolve().parent.parent
_ROLE = re.compile(r":[a-z]+:`~?([^`]+)`")  # :func:`~pkg.mod.name` -> pkg.mod.name
_LITERAL = re.compile(r"``([^`]+)``")  # ``code`` -> code


def plain(text: str | None) -> str:
    """``text`` without RST markup: ````x```` and ``:role:`x``` become x; a trailing ``::`` becomes ``:``."""
    text = _LITERAL.sub(r"\1", _ROLE.sub(r"\1", text or ""))
    return re.sub(r"::$", ":", text, flags=re.MULTILINE)


def commit(full: bool = False) -> str:
    """The hash of the checkout this code runs from, or 'unknown' (an installed wheel, no git):
    short (``--version``), or ``full`` with ``-dirty`` appended where tracked files differ from it
    (what a run and a sweep's parent record as ``git_commit``)."""
    git = ["git", "-C", str(SOURCE_ROOT)]
    try:
        done = subprocess.run(
            [*git, "rev-parse", *([] if full else ["--short"]), "HEAD"],
            capture_output=True,
            text=True,
            timeout=5,
            check=True,
        )
        dirty = (
            full
            and subprocess.run(
                [*git, "status", "--porcelain", "--untracked-files=no"], capture_output=True, text=True, timeout=5
            ).stdout.strip()
        )
    except (OSError, subprocess.SubprocessError):
        return "unknown"
    return (done.stdout.strip() or "unknown") + ("-dirty" if dirty else "")


def version_line(prog: str) -> str:
    """``<prog> <package version> (commit <short sha or 'unknown'>)``."""
    try:
        version = metadata.version(DISTRIBUTION)
    except metadata.PackageNotFoundError:
        version = "unknown"
    return f"{prog} {version} (commit {commit()})"


class _Version(argparse.Action):
    """``--version``: computed only when asked for (it runs git), printed to stdout, exit 0."""

    def __init__(self, option_strings: Sequence[str], dest: str = argparse.SUPPRESS, **kwargs) -> None:
        super().__init__(option_strings, dest, nargs=0, default=argparse.SUPPRESS, **kwargs)

    def __call__(self, parser: argparse.ArgumentParser, *args, **kwargs) -> None:
        print(version_line(parser.prog))
        parser.exit()


class PlainHelpFormatter(argparse.RawDescriptionHelpFormatter):
    """Keeps the description's layout (its example lines), and shows every text without RST markup."""

    def _format_text(self, text: str) -> str:
        return super()._format_text(plain(text))

    def _expand_help(self, action: argparse.Action) -> str:
        return plain(super()._expand_help(action))


def parser_for(
    prog: str, doc: str | None, parser_class: type[argparse.ArgumentParser] = argparse.ArgumentParser, **kwargs
) -> argparse.ArgumentParser:
    """A parser with ``doc`` as its description, help shown as plain text, and ``--version``."""
    parser = parser_class(prog=prog, description=doc, formatter_class=PlainHelpFormatter, **kwargs)
    parser.add_argument("--version", action=_Version, help="print the version and commit, then exit")
    return parser
