"""A depth study's arms (issue 48): each table row whose runs were evaluated at other loop counts
(``mesh-eval --loops/--exit``, or the run's ``depth_eval``), with its seeds' curves.

An arm is a row and the rule its passes past the training K use. A scheme without per-step
parameters has one arm per row (the rule does not apply). A per-step scheme (MeSH; the static and
dynamic sums) trained at a fixed K has one arm per rule evaluated: at K both rules are the trained
model, so each is a test-time choice. Trained at sampled K its own rule (``loop_rule``) is part of
what trained, so its arm is that rule's only. ``depth.csv`` and ``exit.csv`` (the runs' evaluations,
one line per run, loop count or threshold, rule or criterion and validation set) are what a report
folder keeps, so a report is rebuilt from them.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import pandas as pd

from results.rows.aggregate import Results, Row

DEPTH_FILE, EXIT_FILE = "depth.csv", "exit.csv"
# Per run, beside each line: how it trained (``training``: its ``loops.distribution``) and the rule of
# its own passes past K (``loop_rule``), read from its params when the curves are read from the store
# and kept in the folder's CSVs, so a report rebuilt from them builds the same arms.
RUN_FIELDS = ("training", "loop_rule")
DEPTH_COLUMNS = ("run_id", *RUN_FIELDS, "loops", "rule", "set", "loss", "ppl")
EXIT_COLUMNS = ("run_id", *RUN_FIELDS, "criterion", "eps", "loops", "set", "loss", "ppl", "loops_used")
PER_STEP_SCHEMES = ("mesh", "static", "dynamic")  # schemes with parameters per loop step
FIXED = "fixed"
STABILITY = ("stability/spectral_radius", "stability/change_ratio", "stability/change_ratio_trained")


@dataclass
class DepthData:
    """Every run's depth curve and exit curves, long (the columns above)."""

    depth: pd.DataFrame = field(default_factory=lambda: pd.DataFrame(columns=list(DEPTH_COLUMNS)))
    exit: pd.DataFrame = field(default_factory=lambda: pd.DataFrame(columns=list(EXIT_COLUMNS)))

    @property
    def empty(self) -> bool:
        return self.depth.empty and self.exit.empty


@dataclass
class DepthArm:
    """One arm of a depth study: a row under one rule, its seeds' log PPL at every loop count."""

    row: Row
    training: str  # "fixed", or the distribution its loop counts were drawn from
    rule: str | None  # the rule of its passes past K (None: a scheme without per-step parameters)
    trained_loops: int  # the layout's K: where validation ran during training
    seeds: list[str]
    loss: pd.DataFrame  # index: seed; columns: loop count; values: mean validation loss (log PPL)
    exit: pd.DataFrame  # seed, criterion, eps, loops (the most a token ran), loss, ppl, loops_used
    stability: dict[
        str, list[float]
    ]  # each stability metric's final value per seed (inf kept: a step that did not move)

    @property
    def scheme(self) -> str:
        return self.row.scheme

    @property
    def sampled(self) -> bool:
        return self.training != FIXED

    @property
    def label(self) -> str:
        """``mesh, sampled K, rule cycle``: scheme, training, and the rule where one applies."""
        parts = [self.row.scheme, "sampled K" if self.sampled else f"fixed K = {self.trained_loops}"]
        return ", ".join([*parts, f"rule {self.rule}"] if self.rule else parts)

    def at(self, loops: int) -> pd.Series:
        """Each seed's log PPL at ``loops`` (NaN where a seed lacks it)."""
        return self.loss[loops] if loops in self.loss else pd.Series(math.nan, index=self.loss.index)


def depth_arms(results: Results, data: DepthData) -> list[DepthArm]:
    """The arms of ``results``' rows whose runs have depth curves on the main validation set, in
    row order (within a row: the run's own rule first)."""
    if data.depth.empty or not results.sets:
        return []
    main = results.sets[0]
    depth = data.depth[data.depth["set"] == main]
    exits = data.exit[data.exit["set"] == main] if not data.exit.empty else data.exit
    runs = results.runs.set_index("run_id")
    arms = []
    for row in results.rows:
        mine = depth[depth["run_id"].isin(row.run_ids)]
        if mine.empty:
            continue
        training, own = mine["training"].iloc[0], mine["loop_rule"].iloc[0]
        per_step = row.scheme.split("+")[0] in PER_STEP_SCHEMES or row.scheme in PER_STEP_SCHEMES
        rules = sorted(set(mine["rule"]), key=lambda r: (r != own, r)) if per_step else [own]
        if per_step and training != FIXED:
            rules = [own]
        seed_of = dict(zip(row.run_ids, row.seeds, strict=True))
        stability = {
            key: [float(runs.at[r, key]) for r in row.run_ids if key in runs and not math.isnan(float(runs.at[r, key]))]
            for key in STABILITY
        }
        for rule in rules:
            lines = mine[mine["rule"] == rule] if per_step else mine[mine["rule"] == mine["rule"].iloc[0]]
            loss = lines.assign(seed=lines["run_id"].map(seed_of)).pivot_table(
                index="seed", columns="loops", values="loss", aggfunc="first"
            )
            loss.columns = [int(c) for c in loss.columns]
            # the exit runs under the run's own rule: it belongs to that arm
            exit_lines = exits[exits["run_id"].isin(row.run_ids if rule == own else [])]
            exit_lines = exit_lines.assign(seed=exit_lines["run_id"].map(seed_of))
            arms.append(
                DepthArm(
                    row=row,
                    training=training,
                    rule=rule if per_step else None,
                    trained_loops=row.loops,
                    seeds=[s for s in row.seeds if s in loss.index],
                    loss=loss,
                    exit=exit_lines.drop(columns=["run_id", "set", *RUN_FIELDS]).reset_index(drop=True),
                    stability={k: v for k, v in stability.items() if v},
                )
            )
    return arms


__all__ = ["DEPTH_FILE", "EXIT_FILE", "RUN_FIELDS", "DepthArm", "DepthData", "depth_arms"]
