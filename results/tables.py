"""Aggregate runs into the paper's tables and write them as Markdown, LaTeX (booktabs) and CSV.

Rows: finished runs that differ only by seed (same preset, layout, scheme, B and other overrides)
form one row; each cell is the mean ± sample standard deviation (ddof=1) over those seeds with n
(one seed: the value and "n=1", no spread). Blocks: rows of the same preset and the same compute
depth (a looped layout is compute-matched with the vanilla model of its unrolled depth). Within a
block the best value of each loss, PPL (lower) and downstream (higher) column is bold and the
second best underlined (only when the block has three or more values: with two, the other one is
simply not the best).
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pandas as pd

from mesh_model import ConfigError, Layout
from results.collect import RUN_COLUMNS, grouping_params, overrides_label, validation_sets
from results.paper import PaperRow, PaperValue, paper_values

# Paper order of the schemes within a block; others follow by name.
SCHEME_ORDER = (
    "vanilla",
    "base",
    "residual",
    "anchor_emb",
    "anchor",
    "residual+anchor",
    "residual+anchor+anchor_emb",
    "anchor+anchor_emb",
    "static",
    "dynamic",
    "mesh",
)
DOWNSTREAM = (("eval/0shot/avg", "0-shot", "0shot"), ("eval/5shot/avg", "5-shot", "5shot"))
NOT_METRICS = {*RUN_COLUMNS, "main_set"}


# ---------------------------------------------------------------- statistics


@dataclass(frozen=True)
class Stat:
    """A metric over the seeds of one row."""

    values: tuple[float, ...]

    @property
    def n(self) -> int:
        return len(self.values)

    @property
    def mean(self) -> float:
        return statistics.fmean(self.values)

    @property
    def std(self) -> float | None:
        """Sample standard deviation (ddof=1); None for a single seed."""
        return statistics.stdev(self.values) if self.n > 1 else None

    def text(self, decimals: int, scale: float = 1.0) -> str:
        mean = f"{self.mean * scale:.{decimals}f}"
        if self.std is None:
            return f"{mean} (n=1)"
        return f"{mean} ± {self.std * scale:.{decimals}f} (n={self.n})"


def is_accuracy(metric: str) -> bool:
    """Downstream accuracies (``eval/<k>shot/...``): fractions, shown in %, higher is better."""
    return metric.startswith("eval/") and "shot/" in metric


def decimals_for(metric: str, value: float) -> int:
    if metric.endswith("ppl"):
        return 3 if abs(value) < 100 else 1
    if is_accuracy(metric):
        return 2  # shown in %
    if metric.startswith("probe/"):
        return 3
    return 4


# ---------------------------------------------------------------- rows and blocks


@dataclass
class Row:
    """Finished runs that differ only by seed."""

    preset: str
    scheme: str
    layout: str
    buffer_slots: str
    overrides: str
    run_ids: list[str]
    seeds: list[str]
    stats: dict[str, Stat]
    paper: dict[str, PaperValue] = field(default_factory=dict)

    @property
    def depth(self) -> int | None:
        try:
            return Layout.parse(self.layout).compute_depth
        except ConfigError:
            return None

    @property
    def shared_fraction(self) -> float:
        """Distinct layers / compute depth of the layout: 1 for vanilla, smaller the more is looped."""
        try:
            layout = Layout.parse(self.layout)
        except ConfigError:
            return 0.0
        return layout.distinct_layers / layout.compute_depth

    @property
    def loops(self) -> int:
        try:
            return Layout.parse(self.layout).loops
        except ConfigError:
            return 0

    @property
    def label(self) -> str:
        """Short unique name in a block, for legends: ``mesh 1+2R2+1 B5 max_steps=12``."""
        parts = [self.scheme, self.layout]
        if self.buffer_slots:
            parts.append(f"B{self.buffer_slots}")
        if self.overrides:
            parts.append(self.overrides)
        return " ".join(parts)

    @property
    def n(self) -> int:
        return len(self.run_ids)

    def mean(self, metric: str) -> float | None:
        stat = self.stats.get(metric)
        return stat.mean if stat else None


@dataclass
class Block:
    preset: str
    depth: int | None
    rows: list[Row]

    @property
    def name(self) -> str:
        return f"{self.preset}, compute depth {self.depth}" if self.depth else self.preset

    def reference(self, row: Row, scheme: str, same_layout: bool) -> Row | None:
        """The row of ``scheme`` that ``row`` is compared with: same overrides if there is one."""
        candidates = [r for r in self.rows if r.scheme == scheme and (not same_layout or r.layout == row.layout)]
        same = [r for r in candidates if r.overrides == row.overrides]
        return (same or candidates or [None])[0]


@dataclass
class Results:
    """Everything the tables, plots and report are made of."""

    blocks: list[Block]
    runs: pd.DataFrame  # every run read, whatever its status, with a ``row`` column (label) for finished ones
    sets: list[str]  # validation sets, main first
    metric: str  # the key metric asked for
    ppl_metric: str  # what deltas and plots use: the PPL of the key metric's set (or the metric itself)
    lower_is_better: bool
    group_keys: list[str]  # params besides the seed that differ between rows

    @property
    def rows(self) -> list[Row]:
        return [row for block in self.blocks for row in block.rows]

    @property
    def metric_label(self) -> str:
        """How figures and the summary name :attr:`ppl_metric`."""
        if self.ppl_metric == "val_ppl":
            return f"validation PPL ({self.sets[0] if self.sets else 'main set'})"
        return f"{self.ppl_metric} (%)" if is_accuracy(self.ppl_metric) else self.ppl_metric


def ppl_metric_for(metric: str) -> tuple[str, bool]:
    """(the metric deltas and plots use, lower is better) for the key metric."""
    if metric == "val_loss" or metric == "val_ppl":
        return "val_ppl", True
    parts = metric.split("/")
    if metric.startswith("val/") and len(parts) == 3 and parts[2] in ("loss", "ppl"):
        return f"val/{parts[1]}/ppl", True
    if metric.startswith(("eval/loss/", "eval/ppl/")):
        return f"eval/ppl/{parts[-1]}", True
    return metric, not is_accuracy(metric)


def _scheme_rank(scheme: str) -> tuple[int, str]:
    return (SCHEME_ORDER.index(scheme), "") if scheme in SCHEME_ORDER else (len(SCHEME_ORDER), scheme)


def _slots_rank(slots: str) -> float:
    try:
        return float(slots)
    except ValueError:
        return -1.0


def _preset_rank(preset: str) -> tuple[int, str]:
    from mesh_model import PRESETS

    names = list(PRESETS)
    return (names.index(preset), "") if preset in names else (len(names), preset)


def aggregate(
    frame: pd.DataFrame,
    metric: str = "val_loss",
    paper: Sequence[PaperRow] = (),
    prefer: tuple[str, ...] = (),
) -> Results:
    """Group the finished runs of ``frame`` (from :func:`results.collect.collect_runs`) into rows and blocks."""
    frame = frame.copy()
    metric_columns = [c for c in frame.columns if c not in NOT_METRICS]
    finished = frame[frame["status"] == "FINISHED"]
    if metric not in metric_columns and len(finished):
        known = ", ".join(sorted(c for c in metric_columns if not c.startswith("probe/"))) or "(none)"
        raise ValueError(f"--metric {metric!r} is not logged by these runs; known: {known}")
    keys = grouping_params(frame)
    frame["overrides"] = [overrides_label(p, keys) for p in frame["params"]]
    frame["row"] = ""
    rows: list[Row] = []
    group_columns = ["preset", "scheme", "layout", "buffer_slots", "overrides"]
    for values, runs in frame[frame["status"] == "FINISHED"].groupby(group_columns, sort=False, dropna=False):
        preset, scheme, layout, slots, overrides = (str(v) for v in values)
        stats = {}
        for column in metric_columns:
            series = pd.to_numeric(runs[column], errors="coerce")
            finite = [float(v) for v in series if math.isfinite(v)]
            if finite:
                stats[column] = Stat(tuple(finite))
        row = Row(
            preset=preset,
            scheme=scheme,
            layout=layout,
            buffer_slots=slots,
            overrides=overrides,
            run_ids=list(runs["run_id"]),
            seeds=[str(s) for s in runs["seed"]],
            stats=stats,
            paper=paper_values(list(paper), preset, scheme, layout, slots, prefer) if paper else {},
        )
        _add_loop_erank(row, runs)
        rows.append(row)
        frame.loc[runs.index, "row"] = row.label
    blocks: dict[tuple[str, int | None], Block] = {}
    for row in rows:
        blocks.setdefault((row.preset, row.depth), Block(row.preset, row.depth, [])).rows.append(row)
    for block in blocks.values():
        block.rows.sort(
            key=lambda r: (
                r.scheme != "vanilla",
                -r.shared_fraction,
                r.layout,
                _scheme_rank(r.scheme),
                _slots_rank(r.buffer_slots),
                r.overrides,
            )
        )
    ordered = sorted(blocks.values(), key=lambda b: (_preset_rank(b.preset), b.depth or 0))
    ppl_metric, lower = ppl_metric_for(metric)
    return Results(ordered, frame, validation_sets(frame), metric, ppl_metric, lower, keys)


def _add_loop_erank(row: Row, runs: pd.DataFrame) -> None:
    """``probe/erank/loop_mean``: each run's effective rank averaged over the loop states h1..hK."""
    columns = [f"probe/erank/h{t}" for t in range(1, row.loops + 1)]
    if not columns or not all(c in runs for c in columns):
        return
    means = [statistics.fmean(float(v) for v in values) for values in runs[columns].itertuples(index=False)]
    finite = tuple(v for v in means if math.isfinite(v))
    if finite:
        row.stats["probe/erank/loop_mean"] = Stat(finite)


# ---------------------------------------------------------------- tables


@dataclass(frozen=True)
class Column:
    header: str
    align: str = "r"  # LaTeX column type: l or r


@dataclass
class Cell:
    text: str
    value: float | None = None  # what ranks the cell
    mark: str | None = None  # "best" | "second"


@dataclass
class TableBlock:
    name: str
    cells: list[list[Cell]]
    records: list[dict[str, Any]]  # the CSV rows: raw numbers


@dataclass
class Table:
    title: str
    columns: list[Column]
    blocks: list[TableBlock]
    notes: list[str] = field(default_factory=list)


def _stat_cell(row: Row, metric: str, scale: float = 1.0) -> Cell:
    stat = row.stats.get(metric)
    if stat is None:
        return Cell("")
    return Cell(stat.text(decimals_for(metric, stat.mean * scale), scale), stat.mean * scale)


def _stat_record(record: dict[str, Any], name: str, stat: Stat | None, scale: float = 1.0) -> None:
    record[f"{name}_mean"] = stat.mean * scale if stat else None
    record[f"{name}_std"] = stat.std * scale if stat and stat.std is not None else None
    record[f"{name}_n"] = stat.n if stat else 0


def _delta(row: Row, reference: Row | None, metric: str) -> tuple[str, float | None]:
    if reference is None:
        return "", None
    if reference is row:
        return "—", None
    ours, theirs = row.mean(metric), reference.mean(metric)
    if ours is None or theirs is None:
        return "", None
    delta = (ours - theirs) * (100.0 if is_accuracy(metric) else 1.0)  # accuracies in % points
    return f"{delta:+.{decimals_for(metric, theirs)}f}", delta


def _mark(cells: list[list[Cell]], column: int, higher_is_better: bool) -> None:
    ranked = sorted({c[column].value for c in cells if c[column].value is not None}, reverse=higher_is_better)
    if len(ranked) < 2:
        return
    for row in cells:
        cell = row[column]
        if cell.value is None:
            continue
        if cell.value == ranked[0]:
            cell.mark = "best"
        elif len(ranked) >= 3 and cell.value == ranked[1]:
            cell.mark = "second"


def _identity(results: Results) -> tuple[list[Column], bool, bool]:
    has_slots = any(r.buffer_slots for r in results.rows)
    has_overrides = any(r.overrides for r in results.rows)
    columns = [Column("scale", "l"), Column("scheme", "l"), Column("layout", "l")]
    if has_slots:
        columns.append(Column("B"))
    if has_overrides:
        columns.append(Column("other settings", "l"))
    return columns, has_slots, has_overrides


def _identity_cells(row: Row, has_slots: bool, has_overrides: bool) -> list[Cell]:
    cells = [Cell(row.preset), Cell(row.scheme), Cell(row.layout)]
    if has_slots:
        cells.append(Cell(row.buffer_slots))
    if has_overrides:
        cells.append(Cell(row.overrides))
    return cells


def _identity_record(block: Block, row: Row) -> dict[str, Any]:
    return {
        "block": block.name,
        "preset": row.preset,
        "scheme": row.scheme,
        "layout": row.layout,
        "buffer_slots": row.buffer_slots,
        "overrides": row.overrides,
        "n_runs": row.n,
        "seeds": " ".join(row.seeds),
    }


def _spec_cell(kind: str, key: str, block: Block, row: Row, record: dict[str, Any], ppl_metric: str) -> Cell:
    """The cell of one column (``kind``, ``key``) for ``row``; adds the raw numbers to ``record``."""
    if kind == "params":
        stat = row.stats.get(key)
        record[key] = stat.mean if stat else None
        return Cell(f"{stat.mean:,.0f}" if stat else "")
    if kind == "pct":
        stat = row.stats.get(key)
        record[key] = stat.mean if stat else None
        return Cell("100%" if row.scheme == "vanilla" else f"{stat.mean - 100:+.1f}%" if stat else "")
    if kind in ("stat", "stat%"):
        scale = 100.0 if kind == "stat%" else 1.0
        _stat_record(record, f"{key}_pct" if kind == "stat%" else key, row.stats.get(key), scale)
        return _stat_cell(row, key, scale)
    if kind == "paper":
        value = row.paper.get(key)
        record[f"paper_{key}"] = value.value if value else None
        record[f"paper_{key}_table"] = value.table if value else ""
        return Cell(value.text if value else "")
    reference = block.reference(row, key, same_layout=key == "base")  # kind == "delta"
    text, delta = _delta(row, reference, ppl_metric)
    record[f"delta_{ppl_metric}_vs_{key}"] = delta
    return Cell(text)


def _table_blocks(results: Results, specs: list[tuple[str, str]], ranked: dict[int, bool]) -> list[TableBlock]:
    """Identity cells then one cell per spec for every row, block by block; the spec columns in
    ``ranked`` (spec index -> higher is better) get their best and second best marked per block."""
    identity, has_slots, has_overrides = _identity(results)
    first = len(identity)
    blocks = []
    for block in results.blocks:
        cells, records = [], []
        for row in block.rows:
            line = _identity_cells(row, has_slots, has_overrides)
            record = _identity_record(block, row)
            line += [_spec_cell(kind, key, block, row, record, results.ppl_metric) for kind, key in specs]
            cells.append(line)
            records.append(record)
        for index, higher in ranked.items():
            _mark(cells, first + index, higher)
        blocks.append(TableBlock(block.name, cells, records))
    return blocks


def main_table(results: Results) -> Table:
    """The paper-style table: parameters, loss and PPL per validation set (the paper's number beside
    the main set's), deltas against vanilla and base, downstream averages when evaluated."""
    columns, _, _ = _identity(results)
    rows = results.rows
    columns += [Column("non-emb params"), Column("vs vanilla")]
    specs = [("params", "params_non_embedding"), ("pct", "params_pct_of_vanilla")]
    ranked: dict[int, bool] = {}  # spec index -> higher is better

    paper_metrics = {m for r in rows for m in r.paper}
    for i, name in enumerate(results.sets):
        for kind in ("loss", "ppl"):
            metric = f"val/{name}/{kind}"
            if not any(metric in r.stats for r in rows):
                continue
            ranked[len(specs)] = False
            columns.append(Column(f"{'PPL' if kind == 'ppl' else 'loss'} ({name})"))
            specs.append(("stat", metric))
            if i == 0 and kind in paper_metrics:
                columns.append(Column(f"paper {'PPL' if kind == 'ppl' else 'loss'}"))
                specs.append(("paper", kind))
    delta_name = "PPL" if results.ppl_metric.endswith("ppl") else results.ppl_metric
    delta_name += " (% points)" if is_accuracy(results.ppl_metric) else ""
    has_deltas = any(results.ppl_metric in r.stats for r in rows)
    if has_deltas:
        columns += [Column(f"Δ{delta_name} vs vanilla"), Column(f"Δ{delta_name} vs base")]
        specs += [("delta", "vanilla"), ("delta", "base")]
    for metric, header, paper_key in DOWNSTREAM:
        if any(metric in r.stats for r in rows):
            ranked[len(specs)] = True
            columns.append(Column(f"{header} avg (%)"))
            specs.append(("stat%", metric))
            if paper_key in paper_metrics:
                columns.append(Column(f"paper {header}"))
                specs.append(("paper", paper_key))

    notes = [
        "Each cell: mean ± sample standard deviation (ddof=1) over seeds, n = finished runs averaged; "
        "n=1: a single seed, no spread shown.",
        "Bold: best in its block, underlined: second best (only in blocks of three or more values); "
        "lower is better for loss and PPL, higher for downstream accuracy.",
    ]
    if paper_metrics:
        notes.append(
            "paper: the number the MeSH paper reports for the same preset, scheme and layout (and B, where "
            "its table gives one); from " + _paper_sources(rows) + "."
        )
    if has_deltas:
        notes.append(
            f"Δ{delta_name}: difference of means against the block's vanilla row, and against the base row "
            "of the same layout; — marks the reference row itself."
        )
    return Table("Results", columns, _table_blocks(results, specs, ranked), notes)


def _paper_sources(rows: list[Row]) -> str:
    """Which of the paper's tables each paper column was read from, with counts."""
    parts = []
    for metric, header in (("loss", "loss"), ("ppl", "PPL"), ("0shot", "0-shot"), ("5shot", "5-shot")):
        tables = [r.paper[metric].table for r in rows if metric in r.paper]
        if tables:
            counts = ", ".join(f"{t} ({tables.count(t)})" for t in dict.fromkeys(tables))
            parts.append(f"{header}: {counts}")
    return "; ".join(parts)


PROBE_COLUMNS = (
    ("probe/update/core_balance", "core balance"),
    ("probe/cka_rbf/loop_mean", "CKA rbf h(t),h(t+1)"),
    ("probe/cka_linear/loop_mean", "CKA linear h(t),h(t+1)"),
    ("probe/erank/loop_mean", "erank h1..hK"),
)


def _block_order(name: str) -> tuple[int, int]:
    if name == "prelude":
        return (0, 0)
    if name.startswith("core") and name[4:].isdigit():
        return (1, int(name[4:]))
    return (2, 0)


def probe_table(results: Results) -> Table | None:
    """The probes per row (means over seeds): relative update of each block, core balance
    (min/max of the core iterations), loop-to-loop CKA and the loop states' effective rank."""
    rows = results.rows
    updates = sorted(
        {m.split("/")[2] for r in rows for m in r.stats if m.startswith("probe/update/") and m.endswith("/mean")},
        key=_block_order,
    )
    extra = [(m, h) for m, h in PROBE_COLUMNS if any(m in r.stats for r in rows)]
    if not updates and not extra:
        return None
    columns, _, _ = _identity(results)
    metrics = [(f"probe/update/{b}/mean", f"update {b}") for b in updates] + extra
    columns += [Column(header) for _, header in metrics]
    blocks = _table_blocks(results, [("stat", metric) for metric, _ in metrics], {})
    notes = [
        "Relative update 2|f(h)-h|/(|f(h)|+|h|) of each block (mean over held-out samples), then mean ± "
        "sample std over seeds. Core balance: min/max of the core iterations' updates (1 = balanced). "
        "CKA: mean over consecutive loop states. erank: effective rank averaged over h1..hK."
    ]
    return Table("Probes", columns, blocks, notes)


# ---------------------------------------------------------------- writers

_MD_SPECIAL = str.maketrans({c: f"\\{c}" for c in "\\`*_|<>[]"})


def markdown_escape(text: str) -> str:
    return text.translate(_MD_SPECIAL)


def _md_cell(cell: Cell) -> str:
    text = markdown_escape(cell.text)
    if not text:
        return text
    if cell.mark == "best":
        return f"**{text}**"
    if cell.mark == "second":
        return f"<u>{text}</u>"
    return text


def to_markdown(table: Table, heading: str = "###") -> str:
    """One GitHub table per block, each under a heading naming the block, then the notes."""
    header = "| " + " | ".join(markdown_escape(c.header) for c in table.columns) + " |"
    rule = "|" + "|".join("---:" if c.align == "r" else "---" for c in table.columns) + "|"
    parts = []
    for block in table.blocks:
        lines = [f"{heading} {markdown_escape(block.name)}", "", header, rule]
        lines += ["| " + " | ".join(_md_cell(c) for c in cells) + " |" for cells in block.cells]
        parts.append("\n".join(lines))
    notes = "\n".join(f"* {markdown_escape(n)}" for n in table.notes)
    return "\n\n".join(parts + ([notes] if notes else [])) + "\n"


_LATEX_SPECIAL = {
    "\\": r"\textbackslash{}",
    "_": r"\_",
    "%": r"\%",
    "&": r"\&",
    "#": r"\#",
    "$": r"\$",
    "{": r"\{",
    "}": r"\}",
    "~": r"\textasciitilde{}",
    "^": r"\textasciicircum{}",
    "±": r"$\pm$",
    "Δ": r"$\Delta$",
    "—": "--",
    "<": r"\textless{}",
    ">": r"\textgreater{}",
}


def latex_escape(text: str) -> str:
    """LaTeX text with ``\\ _ % & # $ { } ~ ^`` escaped (one pass, so escapes are not escaped again)."""
    return "".join(_LATEX_SPECIAL.get(c, c) for c in text)


def _tex_cell(cell: Cell) -> str:
    text = latex_escape(cell.text)
    if text and cell.mark == "best":
        return rf"\textbf{{{text}}}"
    if text and cell.mark == "second":
        return rf"\underline{{{text}}}"
    return text


def to_latex(table: Table) -> str:
    """A booktabs ``tabular``: \\toprule, the header, \\midrule between blocks, \\bottomrule.
    Needs ``\\usepackage{booktabs}``."""
    spec = "".join(c.align for c in table.columns)
    lines = [
        f"% {table.title}: generated by mesh-results. Needs \\usepackage{{booktabs}}.",
        f"\\begin{{tabular}}{{{spec}}}",
        r"\toprule",
        " & ".join(latex_escape(c.header) for c in table.columns) + r" \\",
    ]
    for block in table.blocks:
        lines.append(r"\midrule")
        lines += [" & ".join(_tex_cell(c) for c in cells) + r" \\" for cells in block.cells]
    lines += [r"\bottomrule", r"\end{tabular}"]
    return "\n".join(lines) + "\n"


def to_frame(table: Table) -> pd.DataFrame:
    return pd.DataFrame.from_records([r for block in table.blocks for r in block.records])


def write_table(table: Table, out_dir: str | Path, stem: str) -> list[Path]:
    """``<stem>.md``, ``<stem>.tex`` and ``<stem>.csv`` in ``out_dir``."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    paths = [out / f"{stem}.md", out / f"{stem}.tex", out / f"{stem}.csv"]
    paths[0].write_text(f"## {table.title}\n\n" + to_markdown(table))
    paths[1].write_text(to_latex(table))
    to_frame(table).to_csv(paths[2], index=False)
    return paths


__all__ = [
    "Block",
    "Results",
    "Row",
    "Stat",
    "Table",
    "aggregate",
    "latex_escape",
    "main_table",
    "markdown_escape",
    "probe_table",
    "to_latex",
    "to_markdown",
    "write_table",
]
