"""What the console scripts of a run share: ``mesh-train --help``, quiet libraries by default, and
the plain lines written to a log file.

``mesh-train --help`` lists what one run can choose: the options of each config group (the files
of ``conf/<group>/``, with their first comment line) and every key of the schema with its default
and its comment, read from the source of the dataclasses (``config.py``, ``data/config.py``), so
the page follows the schema without importing it (no torch, no Lightning: it answers at once).

Lightning, MLflow and Alembic log their start-up chatter (``GPU available``, the litlogger tip,
``Creating initial MLflow database tables``, the ``srun`` hint) at INFO or as a hint-only warning;
:func:`quiet_libraries` keeps it out at the default level ``warning`` and lets it through at
``info``/``debug`` (``-v`` on the CLIs, or the run's ``log_level``).

When the output is not a terminal (a SLURM log, ``nohup``), the lines of ``mesh-train`` and
``mesh-sweep`` begin with :func:`timestamp`; :func:`duration` writes wall times and ETAs.
"""

from __future__ import annotations

import ast
import logging
import os
import re
import shutil
import sys
import time
import warnings
from dataclasses import dataclass
from pathlib import Path

from mesh_model.cli_text import plain

HERE = Path(__file__).resolve().parent
SCHEMA_SOURCES = (HERE / "config.py", HERE / "data" / "config.py", HERE / "loops.py")
CONF = HERE / "conf"
GROUPS = ("data", "trainer", "optim", "loops", "recipe", "arm")  # experiments/config.py GROUP_SCHEMAS, GLOBAL_GROUPS
ROOT_SCHEMA = "TrainConfig"

LEVEL_ENV = "MESH_LOG_LEVEL"  # set by a CLI's -v; inherited by the processes it starts (sweep cells)
DEFAULT_LEVEL = "warning"
LIBRARY_LOGGERS = ("lightning.pytorch", "lightning.fabric", "mlflow", "alembic")
# Lightning's hint that srun exists but was not used: on a machine with SLURM installed, every run
# outside an srun job gets it (twice). A real multi-node misuse fails loudly anyway.
SRUN_HINT = r"The `srun` command is available on your system but is not used"


# --- quiet libraries -----------------------------------------------------------------------------


def resolved_level(configured: str | None = None) -> str:
    """The run's ``log_level`` when set, else ``$MESH_LOG_LEVEL`` (a CLI's ``-v``), else ``warning``."""
    return (configured or os.environ.get(LEVEL_ENV) or DEFAULT_LEVEL).lower()


def quiet_libraries(level: str | None = None) -> None:
    """Set the third-party loggers to ``level`` (see :func:`resolved_level`).

    Lightning and MLflow set their own loggers' levels when first imported: the levels are set
    here on the ones already imported, and MLflow's own switch (``MLFLOW_LOGGING_LEVEL``, unless
    the user set it) covers a later import, in this process or the ones it starts. Call again once
    Lightning is imported (``experiments.trainer`` does)."""
    name = resolved_level(level).upper()
    numeric = logging.getLevelName(name)
    if not isinstance(numeric, int):
        raise ValueError(f"log_level={level!r} is invalid: use debug, info, warning or error")
    if not _USER_MLFLOW_LEVEL:
        os.environ["MLFLOW_LOGGING_LEVEL"] = name
    for logger in LIBRARY_LOGGERS:
        if logger in sys.modules:  # each logger is named after its package
            logging.getLogger(logger).setLevel(numeric)
    # MLflow logs a database error with its traceback at ERROR, then raises it: the raised error is
    # answered (a full disk, a damaged store: one line), its copy in the log is left to -v.
    logging.getLogger(MLFLOW_DB_LOGGER).setLevel(numeric if numeric <= logging.INFO else logging.CRITICAL)
    if numeric > logging.INFO:
        warnings.filterwarnings("ignore", message=SRUN_HINT)
    else:
        warnings.filterwarnings("default", message=SRUN_HINT)


_USER_MLFLOW_LEVEL = "MLFLOW_LOGGING_LEVEL" in os.environ
MLFLOW_DB_LOGGER = "mlflow.store.db.utils"


def take_verbose_flag(argv: list[str]) -> list[str]:
    """``argv`` without ``-v``/``--verbose``; when there was one, ``$MESH_LOG_LEVEL`` becomes info."""
    rest = [a for a in argv if a not in ("-v", "--verbose")]
    if len(rest) != len(argv):
        os.environ[LEVEL_ENV] = "info"
    return rest


# --- lines for a log file ------------------------------------------------------------------------

# Seconds between two plain progress lines of a run whose stderr is not a terminal
# (experiments/callbacks/progress.py); inherited by the cells of a sweep. Console only: not a config key.
PROGRESS_ENV = "MESH_PROGRESS_EVERY_S"
DEFAULT_PROGRESS_EVERY_S = 30.0


def timestamp() -> str:
    """The local time as a log line starts with it: ``2026-12-01 14:03:22``."""
    return time.strftime("%Y-%m-%d %H:%M:%S")


def is_terminal(stream) -> bool:
    """Whether ``stream`` is a terminal (a StringIO, a file or a pipe is not)."""
    isatty = getattr(stream, "isatty", None)
    return bool(isatty and isatty())


def duration(seconds: float) -> str:
    """``45s``, ``3m10s``, ``2h05m``."""
    seconds = max(0, round(seconds))
    if seconds < 60:
        return f"{seconds}s"
    if seconds < 3600:
        return f"{seconds // 60}m{seconds % 60:02d}s"
    return f"{seconds // 3600}h{seconds % 3600 // 60:02d}m"


def script_command(name: str) -> str:
    """How to call this environment's console script ``name`` in a command to copy: its name when
    the PATH finds this one, else its full path (a virtual environment that is not activated)."""
    here = Path(sys.executable).parent / name
    if not here.exists():
        return name
    found = shutil.which(name)
    return name if found and Path(found).resolve() == here.resolve() else str(here)


def progress_every_s() -> float:
    """``$MESH_PROGRESS_EVERY_S`` (seconds, >= 0), else :data:`DEFAULT_PROGRESS_EVERY_S`. A bad value
    is said in one line and the default used: a console setting does not stop a run."""
    text = os.environ.get(PROGRESS_ENV, "").strip()
    if not text:
        return DEFAULT_PROGRESS_EVERY_S
    try:
        value = float(text)
    except ValueError:
        value = -1.0
    if not value >= 0:  # also NaN
        print(
            f"[mesh-train] {PROGRESS_ENV}={text!r} is invalid (seconds >= 0); using {DEFAULT_PROGRESS_EVERY_S:g}",
            file=sys.stderr,
        )
        return DEFAULT_PROGRESS_EVERY_S
    return value


# --- mesh-train --help ---------------------------------------------------------------------------


@dataclass
class Key:
    name: str
    default: str
    note: str
    section: str = ""  # a block comment above the key, shown as a heading


@dataclass
class Schema:
    name: str
    doc: str
    keys: list[Key]
    nested: dict[str, str]  # key -> the schema class it holds


def _default(node: ast.expr | None) -> str:
    if node is None:
        return ""
    if isinstance(node, ast.Call) and getattr(node.func, "id", "") == "field":
        for keyword in node.keywords:
            if keyword.arg == "default_factory":
                factory = keyword.value
                body = factory.body if isinstance(factory, ast.Lambda) else factory
                if isinstance(body, ast.Name):
                    return {"list": "[]", "dict": "{}"}.get(body.id, "")
                return ast.unparse(body)
        return ""
    text = ast.unparse(node)
    return {"None": "null", "True": "true", "False": "false", "MISSING": ""}.get(text, text.strip("'\""))


def read_schemas(sources: tuple[Path, ...] = SCHEMA_SOURCES) -> dict[str, Schema]:
    """Every dataclass of ``sources``: its fields, their defaults and comments, from the source."""
    schemas = {}
    for path in sources:
        source = path.read_text()
        lines = source.splitlines()
        for node in ast.parse(source).body:
            if not isinstance(node, ast.ClassDef):
                continue
            keys, nested, block = [], {}, ""
            for index, item in enumerate(node.body):
                if not isinstance(item, ast.AnnAssign) or not isinstance(item.target, ast.Name):
                    continue
                annotation = ast.unparse(item.annotation)
                if annotation.startswith("ClassVar"):
                    continue
                name = item.target.id
                above = _comment_block(lines, item.lineno - 1)
                if above or not lines[item.lineno - 2].strip():  # a blank line ends a commented block
                    block = above
                trailing = lines[item.end_lineno - 1].partition("  # ")[2].strip()
                after = node.body[index + 1] if index + 1 < len(node.body) else None
                docstring = after.value.value if _is_string(after) else ""
                keys.append(Key(name, _default(item.value), plain(trailing or docstring.strip()), block))
                nested[name] = annotation
            schemas[node.name] = Schema(node.name, plain(ast.get_docstring(node) or ""), keys, nested)
    for schema in schemas.values():
        schema.nested = {k: v for k, v in schema.nested.items() if v in schemas}
    return schemas


def _is_string(node: ast.AST | None) -> bool:
    return isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant) and isinstance(node.value.value, str)


def _comment_block(lines: list[str], line: int) -> str:
    """The ``#`` lines right above line ``line`` (0-based), joined."""
    block = []
    while line > 0 and lines[line - 1].strip().startswith("#"):
        line -= 1
        block.insert(0, lines[line].strip().lstrip("#").strip())
    return plain(" ".join(block))


def group_options(group: str) -> list[tuple[str, str]]:
    """(option, its first comment line, Hydra's ``# @package`` line aside) for every file of
    ``conf/<group>/``."""
    options = []
    for path in sorted((CONF / group).glob("*.yaml")):
        lines = [line for line in path.read_text().splitlines() if not line.startswith("# @package")]
        first = lines[0] if lines else ""
        options.append((path.stem, plain(first.lstrip("#").strip()) if first.startswith("#") else ""))
    return options


def default_options() -> dict[str, str]:
    """group -> the option ``conf/train.yaml`` picks."""
    found = re.findall(r"^\s*-\s*(\w+):\s*(\S+)\s*$", (CONF / "train.yaml").read_text(), flags=re.MULTILINE)
    return {group: option for group, option in found if group in GROUPS}


USAGE = "usage: mesh-train [KEY=VALUE ...] [GROUP=OPTION ...] [-m] [--cfg {job,hydra,all}] [-v] [--version]"
FLAGS = (
    ("-m, --multirun", "one run per combination of comma lists (scheme=base,mesh); or +sweep=<grid>"),
    ("-c, --cfg {job,hydra,all}", "print the composed config and exit; with --resolve, -p/--package KEY"),
    ("-i, --info [WHAT]", "Hydra's information: all, config, defaults, defaults-tree, plugins, searchpath"),
    ("-v, --verbose", "let Lightning, MLflow and Alembic log their INFO lines (also: log_level=debug)"),
    ("--version", "print the version and commit, then exit"),
    ("--hydra-help", "Hydra's own flags (--config-dir, --config-name, --shell-completion, ...)"),
)


def train_help(doc: str) -> str:
    """The ``mesh-train --help`` page: ``doc``, the groups and their options, every key, the flags."""
    schemas = read_schemas()
    root = schemas[ROOT_SCHEMA]
    defaults = default_options()
    out = [USAGE, "", plain(doc).strip(), "", "groups (GROUP=OPTION; the files of experiments/conf/<group>/):"]
    for group in GROUPS:
        for option, note in group_options(group):
            mark = " (default)" if defaults.get(group) == option else ""
            out.append(_row(f"{group}={option}", f"{note}{mark}"))
    out += ["", *model_choices()]
    out += ["", "keys (KEY=VALUE, default shown; a group's keys as GROUP.KEY):"]
    out += _keys(root, "")
    for key, class_name in root.nested.items():
        schema = schemas[class_name]
        out += ["", f"{key}.*: {schema.doc.split(chr(10) + chr(10))[0].replace(chr(10), ' ')}"]
        out += _keys(schema, f"{key}.")
    out += ["", "flags:"] + [_row(flag, note) for flag, note in FLAGS]
    return "\n".join(out) + "\n"


def model_choices() -> list[str]:
    """The presets (``model=``) with their shapes, and the schemes (``scheme=``)."""
    from mesh_model import PRESETS
    from mesh_model.scheme_names import NAMED_SCHEMES

    out = ["presets (model=NAME: d_model, heads, vanilla depth, paper layout, peak LR):"]
    for name, p in PRESETS.items():
        moe = f", MoE {p.moe_experts} experts top-{p.moe_top_k}" if p.moe_experts else ""
        out.append(
            _row(f"model={name}", f"d={p.d_model}, {p.n_heads} heads, {p.layers} layers, {p.layout}, lr {p.lr:g}{moe}")
        )
    out += ["schemes (scheme=NAME; any '+'-joined, optionally weighted, sum of residual, anchor, anchor_emb too):"]
    out.append("  " + ", ".join(n for n in NAMED_SCHEMES if n != "anchor*") + " (anchor* = anchor_emb)")
    return out


def _keys(schema: Schema, prefix: str) -> list[str]:
    out, section = [], ""
    for key in schema.keys:
        if key.name in schema.nested:
            continue
        if key.section != section:
            section = key.section
            out.append(f"  # {section}" if section else "")
        default = f"={key.default}" if key.default else ""
        out.append(_row(f"{prefix}{key.name}{default}", key.note))
    return out


def _row(left: str, note: str, column: int = 34) -> str:
    left = f"  {left}"
    if not note:
        return left
    return f"{left}  {note}" if len(left) >= column - 2 else f"{left:<{column}}{note}"
