"""What goes in the paper's tables: columns, cells, and the best and second best of each block.

:func:`main_table` (parameters, loss and PPL per validation set, the paper's numbers, deltas,
downstream accuracy) and :func:`probe_table` turn :class:`~results.aggregate.Results` into a
:class:`Table`; :mod:`results.render` writes it. Within a block the best value of each loss, PPL
(lower) and downstream (higher) column is bold and the second best underlined (only when the block
has three or more values: with two, the other one is simply not the best).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from results.aggregate import Block, Results, Row, Stat, decimals_for, is_accuracy

DOWNSTREAM = (("eval/0shot/avg", "0-shot", "0shot"), ("eval/5shot/avg", "5-shot", "5shot"))


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


__all__ = ["Table", "main_table", "probe_table"]
