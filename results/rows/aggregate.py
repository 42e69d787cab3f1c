"""Rows of runs that differ only by seed, blocks of compute-matched rows, mean ± std with n.

Rows: finished runs that differ only by seed (same preset, layout, scheme, B and other overrides)
form one row; each metric is the mean ± sample standard deviation (ddof=1) over those seeds with n
(one seed: the value and "n=1", no spread). The per-seed values are kept, so that two rows can be
compared by a test over seeds (:meth:`Row.compare`, :mod:`results.stats.comparison`). Two finished runs of a
row with the same ``config_hash`` and seed are the same model trained twice (a re-run, or an
equivalent spelling of its config), not two replicates: only the latest by end time counts, and
the others are listed in :attr:`Results.duplicates`. Blocks: rows of the same preset and the same
compute depth (a looped layout is compute-matched with the vanilla model of its unrolled depth).
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import pandas as pd

from experiments.identity import applies_to
from mesh_model import ConfigError, Layout
from mesh_model.scheme_names import PAPER_SCHEMES
from results.rows.frame import NONFINITE, RUN_COLUMNS, grouping_params, overrides_label, validation_sets
from results.rows.paper import PaperRow, PaperValue, paper_values
from results.stats.comparison import Comparison, compare, is_ppl
from results.stats.permutation import paired_differences

NOT_METRICS = {*RUN_COLUMNS, "main_set"}
NONFINITE_MARK = "[non-finite loss]"  # in the label of the row of runs trained past a non-finite loss
ACTIVE_PARAMS = "params_active_non_embedding"  # logged by mixture-of-experts runs only
LOOP_ERANK = "probe/erank/loop_mean"


# ---------------------------------------------------------------- statistics


@dataclass(frozen=True)
class Stat:
    """A metric over the seeds of one row: ``values[i]`` is the run of seed ``seeds[i]``."""

    values: tuple[float, ...]
    seeds: tuple[str, ...] = ()

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

    @property
    def sample(self) -> dict[str, float] | tuple[float, ...]:
        """``{seed: value}`` when every value has its own seed (what a paired test needs), else the values."""
        if len(self.seeds) == self.n and len(set(self.seeds)) == self.n and all(self.seeds):
            return dict(zip(self.seeds, self.values, strict=True))
        return self.values

    def text(self, decimals: int, scale: float = 1.0) -> str:
        mean = f"{self.mean * scale:.{decimals}f}"
        if self.std is None:
            return f"{mean} (n=1)"
        return f"{mean} ± {self.std * scale:.{decimals}f} (n={self.n})"


def is_accuracy(metric: str) -> bool:
    """Downstream accuracies (``eval/<k>shot/...``): fractions, shown in %, higher is better."""
    return metric.startswith("eval/") and "shot/" in metric


def _log(sample: Any) -> Any:
    if isinstance(sample, dict):
        return {k: math.log(v) for k, v in sample.items()}
    return tuple(math.log(v) for v in sample)


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

    def settings_for(self, scheme: str) -> str:
        """This row's overrides that would change a run of ``scheme`` (MeSH's own settings say nothing
        of a base run): what a row of ``scheme`` must share to be compared with this one."""
        return " ".join(w for w in self.overrides.split() if applies_to(w.split("=", 1)[0], scheme))

    def comparable(self, other: Row) -> bool:
        """Same settings, leaving out on each side the ones that cannot change the other's scheme (a
        MeSH arm's ``model_overrides.mesh_router_z_coef`` is compared with the plain base row)."""
        return self.settings_for(other.scheme) == other.settings_for(self.scheme)

    @property
    def is_moe(self) -> bool:
        """A mixture-of-experts row: its runs logged their active parameters (dense runs do not)."""
        return ACTIVE_PARAMS in self.stats

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

    def compare(self, other: Row, metric: str) -> Comparison | None:
        """This row's ``metric`` against ``other``'s over seeds (:func:`results.stats.comparison.compare`:
        paired on common seeds, else Welch); a PPL (:func:`is_ppl`) on the log scale, so that Δ is the
        difference of mean log PPL (= of mean val loss). None when either row lacks it.

        The one comparison of a pair of rows: the table, the ranking, the terminal, the claims and the
        parent run's note all show this Δ, interval and p."""
        ours, theirs = self.stats.get(metric), other.stats.get(metric)
        if ours is None or theirs is None:
            return None
        return compare(*self._samples(other, metric))

    def paired_differences(self, other: Row, metric: str) -> list[float] | None:
        """The per-seed differences (this - other) that :meth:`compare` pairs, in seed order (a PPL on
        the log scale); None where it does not pair them (Welch) or either row lacks ``metric``."""
        if metric not in self.stats or metric not in other.stats:
            return None
        return paired_differences(*self._samples(other, metric))

    def _samples(self, other: Row, metric: str) -> tuple[Any, Any]:
        ours, theirs = self.stats[metric], other.stats[metric]
        if is_ppl(metric) and min(ours.values + theirs.values) > 0:
            return _log(ours.sample), _log(theirs.sample)
        return ours.sample, theirs.sample


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
        same = [r for r in candidates if r.comparable(row)]
        found = same or candidates
        return found[0] if found else None


@dataclass(frozen=True)
class Duplicate:
    """A finished run left out of its row: the same config and seed as a later run of that row."""

    run_id: str
    run_name: str
    kept_run_id: str
    kept_run_name: str
    row: str  # the row's label
    seed: str
    config_hash: str


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
    duplicates: list[Duplicate] = field(default_factory=list)  # finished runs counted once, not twice

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
    """The paper's order of the schemes within a block (:data:`PAPER_SCHEMES`); others follow by name."""
    return (PAPER_SCHEMES.index(scheme), "") if scheme in PAPER_SCHEMES else (len(PAPER_SCHEMES), scheme)


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
    """Group the finished runs of ``frame`` (from :func:`results.runs.store.collect_runs`) into rows and blocks."""
    frame = frame.copy()
    metric_columns = [c for c in frame.columns if c not in NOT_METRICS]
    finished = frame[frame["status"] == "FINISHED"]
    if metric not in metric_columns and len(finished):
        known = ", ".join(sorted(c for c in metric_columns if not c.startswith("probe/"))) or "(none)"
        raise ValueError(f"--metric {metric!r} is not logged by these runs; known: {known}")
    keys = grouping_params(frame)
    frame["overrides"] = [
        " ".join(filter(None, [overrides_label(p, keys), NONFINITE_MARK if status == NONFINITE else ""]))
        for p, status in zip(frame["params"], frame["status"], strict=True)
    ]
    frame["row"] = ""
    frame["duplicate_of"] = ""
    rows: list[Row] = []
    duplicates: list[Duplicate] = []
    group_columns = ["preset", "scheme", "layout", "buffer_slots", "overrides"]
    tabulated = frame[frame["status"].isin(["FINISHED", NONFINITE])]  # a non-finite run: its own marked row
    for values, group in tabulated.groupby(group_columns, sort=False, dropna=False):
        preset, scheme, layout, slots, overrides = (str(v) for v in values)
        runs, dropped = _one_run_per_replicate(group)
        stats = {}
        for column in metric_columns:
            series = pd.to_numeric(runs[column], errors="coerce")
            finite = [(str(s), float(v)) for s, v in zip(runs["seed"], series, strict=True) if math.isfinite(v)]
            if finite:
                stats[column] = Stat(tuple(v for _, v in finite), tuple(s for s, _ in finite))
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
        for index, kept in dropped.items():
            run = frame.loc[index]
            frame.loc[index, "duplicate_of"] = kept["run_id"]
            duplicates.append(
                Duplicate(
                    str(run["run_id"]),
                    str(run["run_name"] or run["run_id"]),
                    str(kept["run_id"]),
                    str(kept["run_name"] or kept["run_id"]),
                    row.label,
                    str(run["seed"]),
                    str(run["config_hash"]),
                )
            )
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
    return Results(ordered, frame, validation_sets(frame), metric, ppl_metric, lower, keys, duplicates)


def _one_run_per_replicate(runs: pd.DataFrame) -> tuple[pd.DataFrame, dict[object, pd.Series]]:
    """The finished runs of one row with one run per (``config_hash``, seed): the same config and
    seed trained twice is one replicate, and the latest by end time stands for it. Returns
    (the runs kept, {index of a run left out: the run kept instead}). Runs without a
    ``config_hash`` tag cannot be told apart and are all kept."""
    hashed = runs[runs["config_hash"].astype(str).str.len() > 0]
    dropped: dict[object, pd.Series] = {}
    for _, same in hashed.groupby([hashed["config_hash"].astype(str), hashed["seed"].astype(str)], sort=False):
        if len(same) < 2:
            continue
        ordered = same.assign(_end=pd.to_datetime(same["end_time"], errors="coerce")).sort_values(
            ["_end", "start_time"], kind="stable", na_position="first"
        )
        kept = ordered.iloc[-1]
        for index in ordered.index[:-1]:
            dropped[index] = kept
    return runs.drop(index=list(dropped)), dropped


def _add_loop_erank(row: Row, runs: pd.DataFrame) -> None:
    """``probe/erank/loop_mean``: each run's effective rank averaged over the loop states h1..hK, as
    the probe logs it (:meth:`mesh_model.probes.ProbeReport.loop_erank`), or for a run probed
    before it did, the same mean of its ``probe/erank/h<t>``."""
    columns = [f"probe/erank/h{t}" for t in range(1, row.loops + 1)]
    if not columns:
        return
    logged = runs[LOOP_ERANK] if LOOP_ERANK in runs else pd.Series(math.nan, index=runs.index)
    means = pd.to_numeric(logged, errors="coerce")
    if all(c in runs for c in columns):
        computed = [statistics.fmean(float(v) for v in values) for values in runs[columns].itertuples(index=False)]
        means = means.fillna(pd.Series(computed, index=runs.index))
    finite = [(str(s), float(v)) for s, v in zip(runs["seed"], means, strict=True) if math.isfinite(v)]
    if finite:
        row.stats[LOOP_ERANK] = Stat(tuple(v for _, v in finite), tuple(s for s, _ in finite))


__all__ = ["Block", "Duplicate", "Results", "Row", "Stat", "aggregate"]
