"""What goes in the paper's tables: columns, cells, tests, and the best and second best of each block.

:func:`main_table` (parameters, and the active ones where a row is a mixture of experts, loss and
PPL per validation set, the paper's numbers, differences against vanilla and base, downstream
accuracy) and :func:`probe_table` (with a mixture of experts' routing) turn
:class:`~results.rows.aggregate.Results` into a :class:`Table`; :mod:`results.render.formats` writes it. Every
difference between two rows comes with its 95% confidence interval, p-value and test
(:mod:`results.stats.comparison`). Within a block the best mean of each loss, PPL (lower) and downstream
(higher) column is bold and the second best underlined (only when the block has three or more
values: with two, the other one is simply not the best); the marks rank means, not significance.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from mesh_model.probe_names import block_order, shown_blocks
from results.rows.aggregate import ACTIVE_PARAMS, Block, Results, Row, Stat, decimals_for, is_accuracy
from results.stats.comparison import ALPHA, METHOD, delta_text, format_p

DOWNSTREAM = (("eval/0shot/avg", "0-shot", "0shot"), ("eval/5shot/avg", "5-shot", "5shot"))


@dataclass(frozen=True)
class Column:
    header: str
    align: str = "r"  # LaTeX column type: l or r
    markdown: bool = True  # False: in LaTeX and the CSV only (Markdown names each block in a heading)


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


def _compare_cells(row: Row, reference: Row | None, metric: str, record: dict[str, Any], key: str) -> list[Cell]:
    """Δ (95% CI), p and test of ``row`` against ``reference`` in ``metric``; adds delta, ci_low,
    ci_high, p and test to ``record`` (suffix ``<metric>_vs_<key>``)."""
    suffix = f"{metric}_vs_{key}"
    comparison = row.compare(reference, metric) if reference is not None and reference is not row else None
    if comparison is not None and is_accuracy(metric):
        comparison = comparison.scaled(100.0)  # accuracies in % points
    record[f"delta_{suffix}"] = comparison.diff if comparison else None
    record[f"ci_low_{suffix}"] = comparison.ci_low if comparison else None
    record[f"ci_high_{suffix}"] = comparison.ci_high if comparison else None
    record[f"p_{suffix}"] = comparison.p if comparison else None
    record[f"test_{suffix}"] = comparison.test if comparison else ""
    if reference is row:
        return [Cell("—"), Cell(""), Cell("")]
    if comparison is None or reference is None:
        return [Cell(""), Cell(""), Cell("")]
    text = delta_text(comparison, metric, decimals_for(metric, reference.stats[metric].mean))
    return [Cell(text), Cell(format_p(comparison.p)), Cell(comparison.test)]


def _mark(cells: list[list[Cell]], column: int, higher_is_better: bool) -> None:
    ranked = sorted({v for c in cells if (v := c[column].value) is not None}, reverse=higher_is_better)
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
    columns = [Column("scale", "l", markdown=False), Column("scheme", "l"), Column("layout", "l")]
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


@dataclass(frozen=True)
class Spec:
    """What a group of columns shows. ``kind``: ``params`` | ``active`` (``key`` for a
    mixture-of-experts row, its ``params_non_embedding`` for a dense one, whose every parameter is
    active) | ``pct`` | ``stat`` | ``stat%`` (one column of ``key``), ``update`` (the probe ``metric`` (``update`` or ``state_update``) of block
    ``key`` as shown, see :func:`_shown_blocks`), ``paper`` (the paper's number ``key``),
    ``compare`` (three columns: Δ with its 95% CI, p and test of ``metric`` against the block's
    ``key`` row, named ``label``)."""

    kind: str
    key: str
    header: str = ""
    metric: str = ""
    label: str = ""
    higher_is_better: bool | None = None  # ranked (best and second marked) when not None

    @property
    def columns(self) -> list[Column]:
        if self.kind != "compare":
            return [Column(self.header)]
        versus = f"{self.label} vs {self.key}"
        return [Column(f"Δ{versus} (95% CI)"), Column(f"p ({versus})"), Column(f"test ({versus})")]


def _spec_cells(spec: Spec, block: Block, row: Row, record: dict[str, Any]) -> list[Cell]:
    """The cells of one spec for ``row``; adds the raw numbers to ``record``."""
    kind, key = spec.kind, spec.key
    if kind in ("params", "active"):
        stat = row.stats.get(key)
        if stat is None and kind == "active":
            stat = row.stats.get("params_non_embedding")
        record[key] = stat.mean if stat else None
        return [Cell(f"{stat.mean:,.0f}" if stat else "")]
    if kind == "pct":
        stat = row.stats.get(key)
        record[key] = stat.mean if stat else None
        return [Cell("100%" if row.scheme == "vanilla" else f"{stat.mean - 100:+.1f}%" if stat else "")]
    if kind in ("stat", "stat%"):
        scale = 100.0 if kind == "stat%" else 1.0
        _stat_record(record, f"{key}_pct" if kind == "stat%" else key, row.stats.get(key), scale)
        return [_stat_cell(row, key, scale)]
    if kind == "update":  # key: the block shown; a row without it (vanilla: no coda) leaves it empty
        logged = _shown_blocks(row, spec.metric).get(key)
        metric = f"probe/{spec.metric}/{logged}/mean" if logged else ""
        _stat_record(record, f"probe/{spec.metric}/{key}/mean", row.stats.get(metric))
        return [_stat_cell(row, metric)]
    if kind == "paper":
        value = row.paper.get(key)
        record[f"paper_{key}"] = value.value if value else None
        record[f"paper_{key}_table"] = value.table if value else ""
        return [Cell(value.text if value else "")]
    reference = block.reference(row, key, same_layout=key == "base")  # kind == "compare"
    return _compare_cells(row, reference, spec.metric, record, key)


def _table(title: str, results: Results, specs: list[Spec], notes: list[str]) -> Table:
    """Identity columns then each spec's columns, block by block; in each block the best and second
    best of every ranked spec are marked."""
    columns, has_slots, has_overrides = _identity(results)
    ranked: dict[int, bool] = {}  # column index -> higher is better
    for spec in specs:
        if spec.higher_is_better is not None:
            ranked[len(columns)] = spec.higher_is_better
        columns += spec.columns
    blocks = []
    for block in results.blocks:
        cells, records = [], []
        for row in block.rows:
            line = _identity_cells(row, has_slots, has_overrides)
            record = _identity_record(block, row)
            for spec in specs:
                line += _spec_cells(spec, block, row, record)
            cells.append(line)
            records.append(record)
        for index, higher in ranked.items():
            _mark(cells, index, higher)
        blocks.append(TableBlock(block.name, cells, records))
    return Table(title, columns, blocks, notes)


CELL_NOTE = (
    "Each cell: mean ± sample standard deviation (ddof=1) over seeds, n = finished runs averaged; "
    "n=1: a single seed, no spread shown."
)
MARKS_NOTE = (
    "Bold: the best mean in its block, underlined: the second best (only in blocks of three or more "
    "values); lower is better for loss and PPL, higher for downstream accuracy. The marks rank means "
    "only and do not say that a difference is significant: the Δ columns (and claims.md) carry the tests."
)
TEST_NOTE = (
    "Δ (95% CI): difference of means (this row minus the reference) with its 95% confidence interval; "
    f"p and test: {METHOD}. — marks the reference row itself; p ≥ {ALPHA} does not show the rows equal "
    "(at this number of seeds the test may not detect the paper's effect): claims.md gives each claim's minimal "
    "detectable effect and equivalence verdict."
)


def main_table(results: Results) -> Table:
    """The paper-style table: parameters, loss and PPL per validation set (the paper's number beside
    the main set's), differences against vanilla and base with their tests, downstream averages."""
    rows = results.rows
    specs = [Spec("params", "params_non_embedding", "non-emb params")]
    has_moe = any(ACTIVE_PARAMS in r.stats for r in rows)
    if has_moe:
        specs.append(Spec("active", ACTIVE_PARAMS, "active non-emb params"))
    specs.append(Spec("pct", "params_pct_of_vanilla", "vs vanilla"))
    paper_metrics = {m for r in rows for m in r.paper}
    for i, name in enumerate(results.sets):
        for kind in ("loss", "ppl"):
            metric = f"val/{name}/{kind}"
            if not any(metric in r.stats for r in rows):
                continue
            label = "PPL" if kind == "ppl" else "loss"
            specs.append(Spec("stat", metric, f"{label} ({name})", higher_is_better=False))
            if i == 0 and kind in paper_metrics:
                specs.append(Spec("paper", kind, f"paper {label}"))
    delta_name = "PPL" if results.ppl_metric.endswith("ppl") else results.ppl_metric
    delta_name += " (% points)" if is_accuracy(results.ppl_metric) else ""
    has_deltas = any(results.ppl_metric in r.stats for r in rows)
    if has_deltas:
        specs += [Spec("compare", ref, metric=results.ppl_metric, label=delta_name) for ref in ("vanilla", "base")]
    for metric, header, paper_key in DOWNSTREAM:
        if any(metric in r.stats for r in rows):
            specs.append(Spec("stat%", metric, f"{header} avg (%)", higher_is_better=True))
            if paper_key in paper_metrics:
                specs.append(Spec("paper", paper_key, f"paper {header}"))

    notes = [CELL_NOTE, MARKS_NOTE]
    if has_moe:
        notes.append(
            "non-emb params: every non-embedding parameter (a mixture of experts: all E experts); active non-emb "
            "params: what one token applies (the router and the top-k experts of each MoE block; a dense row: "
            "all of them); vs vanilla: non-emb params against the vanilla row of the same preset."
        )
    if paper_metrics:
        notes.append(
            "paper: the number the MeSH paper reports for the same preset, scheme and layout (and B, where "
            "its table gives one); from " + _paper_sources(rows) + "."
        )
    if has_deltas:
        notes.append(
            f"Δ{delta_name} vs vanilla: against the block's vanilla row; vs base: against the base row of the "
            "same layout."
        )
        notes.append(TEST_NOTE)
    return _table("Results", results, specs, notes)


def _paper_sources(rows: list[Row]) -> str:
    """Which of the paper's tables each paper column was read from, with counts."""
    parts = []
    for metric, header in (("loss", "loss"), ("ppl", "PPL"), ("0shot", "0-shot"), ("5shot", "5-shot")):
        tables = [r.paper[metric].table for r in rows if metric in r.paper]
        if tables:
            counts = ", ".join(f"{t} ({tables.count(t)})" for t in dict.fromkeys(tables))
            parts.append(f"{header}: {counts}")
    return "; ".join(parts)


CKA_ESTIMATORS = (
    ("cka_rbf", "rbf"),  # the paper's (biased) estimator
    ("cka_rbf_debiased", "rbf debiased"),
    ("cka_linear", "linear"),
    ("cka_linear_debiased", "linear debiased"),
)
# The probe differences tested against the base row of the same layout: metric -> label.
PROBE_COMPARED = (
    ("probe/update/core_balance", "core balance"),
    ("probe/cka_rbf/loop_mean", "CKA rbf"),
    ("probe/cka_rbf_debiased/loop_mean", "CKA rbf debiased"),
    ("probe/erank/loop_mean", "erank"),
    ("probe/moe_jaccard/loop_mean", "Jaccard"),
)
# A mixture of experts' routing (experiments.probing.routing): metric -> header.
ROUTING_COLUMNS = (
    ("probe/moe_load_cv/mean", "expert load CV"),
    ("probe/moe_entropy/mean", "router entropy"),
    ("probe/moe_jaccard/loop_mean", "Jaccard t,t+1"),
    ("probe/moe_jaccard/chance", "Jaccard chance"),
)


def _shown_blocks(row: Row, kind: str) -> dict[str, str]:
    """The update blocks of ``row`` a reader sees -> the block logged under ``probe/<kind>/<block>/mean``
    (:func:`mesh_model.probe_names.shown_blocks`: a vanilla row has one, ``stack``)."""
    prefix = f"probe/{kind}/"
    logged = [m.split("/")[2] for m in row.stats if m.startswith(prefix) and m.endswith("/mean")]
    return shown_blocks(logged, vanilla=row.scheme == "vanilla")


def _update_blocks(rows: list[Row], kind: str) -> list[str]:
    """The blocks any row shows: stack (vanilla), prelude, core1..K, coda."""
    return sorted({b for r in rows for b in _shown_blocks(r, kind)}, key=block_order)


def probe_table(results: Results) -> Table | None:
    """The probes per row (means over seeds): each block's core update and state update, their
    balance over the core iterations, loop-to-loop CKA beside its null floor for every estimator
    logged, the loop states' effective rank, then the tested differences against base."""
    rows = results.rows
    present = {m for r in rows for m in r.stats}
    updates = [Spec("update", b, f"update {b}", metric="update") for b in _update_blocks(rows, "update")]
    updates += [
        Spec("update", b, f"state update {b}", metric="state_update") for b in _update_blocks(rows, "state_update")
    ]
    metrics = [
        (m, h)
        for m, h in (
            ("probe/update/core_balance", "core balance"),
            ("probe/state_update/core_balance", "state balance"),
        )
        if m in present
    ]
    for estimator, name in CKA_ESTIMATORS:
        for metric, header in (
            (f"probe/{estimator}/loop_mean", f"CKA {name} h(t),h(t+1)"),
            (f"probe/{estimator}/floor", f"floor {name}"),
        ):
            if metric in present:
                metrics.append((metric, header))
    if "probe/erank/loop_mean" in present:
        metrics.append(("probe/erank/loop_mean", "erank h1..hK"))
    routing = [(m, h) for m, h in ROUTING_COLUMNS if m in present]
    metrics += routing
    if not metrics and not updates:
        return None
    specs = updates + [Spec("stat", metric, header) for metric, header in metrics]
    compared = [(m, label) for m, label in PROBE_COMPARED if m in present]
    specs += [Spec("compare", "base", metric=m, label=label) for m, label in compared]
    notes = [
        "Each cell: the probe's value on held-out samples, then mean ± sample std (ddof=1) over seeds.",
        "update <block>: the block's own update, core update f(h) vs h: 2|f(h)-h|/(|f(h)|+|h|) (the paper's "
        "probe); update stack: a vanilla row's one stack of layers, embedding to output (it has no prelude, "
        "core or coda, and those columns are empty for it). state update <block>: the same measure between consecutive states h(t-1) -> h(t), which "
        "includes what the scheme adds to f(h). core balance / state balance: min/max of the core "
        "iterations' update / state update (1 = balanced).",
        "CKA <estimator> h(t),h(t+1): mean over consecutive loop states (rbf: the paper's biased RBF "
        "estimator; debiased: the unbiased HSIC estimator). floor: the same estimator's null floor, its "
        "value for unrelated states of the same shape: only the distance above it is similarity. "
        "erank: effective rank averaged over h1..hK.",
    ]
    unsplit = [
        r.label
        for r in rows
        if r.loops
        and any(m.startswith("probe/update/") for m in r.stats)
        and not any(m.startswith("probe/state_update/") for m in r.stats)
    ]
    if unsplit:
        notes.append(
            "Rows without state update columns (" + ", ".join(unsplit) + ") may come from runs probed before the "
            "two measures were split, which logged the state update h(t-1) -> h(t) under probe/update: there, "
            "the update columns may hold the state update."
        )
    if routing:
        notes.append(
            "Mixture of experts (router calls of every MoE block, on the same held-out tokens): expert load CV, "
            "std/mean of the experts' shares of the top-k choices (0 = balanced), and router entropy (nats, at "
            "most log E), each the mean over every router call; Jaccard t,t+1: overlap of a token's chosen "
            "experts between consecutive loop iterations, mean over the core blocks (1 = the same experts); "
            "Jaccard chance: its value for two unrelated random top-k choices. Per call: probe/moe_* in each "
            "run's probes/final/probes.csv."
        )
    if compared:
        notes += ["Δ<probe> vs base: against the base row of the same layout.", TEST_NOTE]
    return _table("Probes", results, specs, notes)


__all__ = ["Spec", "Table", "main_table", "probe_table"]
