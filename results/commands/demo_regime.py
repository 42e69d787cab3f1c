"""What the main job's answer is set beside: the regime of its runs and the decided result, which
comes from another regime (the one-pass reproduction).

The main job (``mesh-demo``) trains every scheme for 400 steps on another corpus, at one LR and two
seeds. Its terminal output, ``report.md``, ``claims.md`` and the sweep's parent run open with its own
answer (:func:`results.render.answer.opening`), then :func:`later_training_lines`: one line naming the
decided result and where it is, from the committed one-pass reproduction's own numbers (read from its
``runs.csv`` and ``curves.csv``, never typed in), stated as that regime's; then :meth:`Regime.lines`
(tokens seen, tokens per parameter, passes over the data, seeds, the peak LRs). The job records these
context lines on its parent run (:data:`results.publish.parents.CONTEXT_TAG`), so ``mesh-results`` keeps them.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import pandas as pd

if TYPE_CHECKING:
    from experiments.plan import RunPlan

ONE_PASS = Path(__file__).parent.parent / "cpu-reproduction" / "one-pass" / "schemes"
ONE_PASS_CITED = "results/cpu-reproduction/one-pass"  # how the lines name it (from the repository root)
PPL = "val/docs/ppl"
CORPUS = PPL.split("/")[1]  # the one-pass grid's validation (and training) corpus


@dataclass(frozen=True)
class Regime:
    """The planned runs of a grid, as a reader needs them to judge its ranking."""

    schemes: tuple[str, ...]
    seeds: int
    steps: int
    tokens: int  # seen by each run
    params_non_embedding: tuple[int, ...]  # one per scheme
    train_tokens: int | None  # the corpus's training split; None when unknown
    corpus: str
    lrs: tuple[float, ...]  # the distinct peak LRs of the grid

    @property
    def passes(self) -> float | None:
        return self.tokens / self.train_tokens if self.train_tokens else None

    def lines(self) -> list[str]:
        low, high = min(self.params_non_embedding), max(self.params_non_embedding)
        per_param = _span(self.tokens / high, self.tokens / low)
        passes = f", {self.passes:.2f} passes over {self.corpus}'s training split" if self.passes else ""
        lr = (
            f"one peak LR for every scheme ({self.lrs[0]:g})"
            if len(self.lrs) == 1
            else f"peak LRs {', '.join(f'{v:g}' for v in self.lrs)}"
        )
        fragile = " (under 3 seeds every test is fragile)" if self.seeds < 3 else ""
        return [
            f"Regime: {len(self.schemes)} schemes x {self.seeds} seeds{fragile}, {self.steps:,} steps each = "
            f"{_tokens(self.tokens)} tokens ({per_param} tokens per non-embedding parameter{passes}), {lr}.",
        ]


def _span(low: float, high: float) -> str:
    return f"{low:.1f}" if round(low, 1) == round(high, 1) else f"{low:.1f}-{high:.1f}"


def _tokens(n: float) -> str:
    if n >= 1e6:
        return f"{n / 1e6:.2f}M"
    return f"{n / 1e3:.0f}k" if n >= 1e4 else f"{n / 1e3:.1f}k"


@dataclass(frozen=True)
class LaterTraining:
    """The one-pass schemes grid's answer, computed from its committed CSVs."""

    tokens: float  # seen by each run at the end
    seeds: dict[str, int]  # finished seeds per scheme
    final_ppl: dict[str, float]  # mean final PPL per scheme, over all its seeds (as its report ranks)
    common_seeds: int  # the seeds every scheme ran: the curves are compared on these
    mesh_first_until: float | None  # the last validation (tokens) with MeSH's mean PPL the lowest
    mesh_above_base_until: float | None  # the last validation with MeSH's mean PPL below base's

    def change(self, scheme: str) -> float:
        """MeSH's final mean PPL relative to ``scheme``'s: +0.108 is 10.8% worse."""
        return self.final_ppl["mesh"] / self.final_ppl[scheme] - 1.0

    @property
    def mesh_rank_at_end(self) -> int:
        return sorted(self.final_ppl, key=self.final_ppl.__getitem__).index("mesh") + 1

    def lines(self) -> list[str]:
        """One line: the decided result, named as another regime's (never these runs' phase)."""
        counts = sorted(set(self.seeds.values()))
        seeds = f"{counts[0]}" if len(counts) == 1 else f"{counts[0]}-{counts[-1]}"
        led = "MeSH never had the lowest mean PPL there"
        if self.mesh_first_until is not None:
            led = f"MeSH had the lowest mean PPL there until {_tokens(self.mesh_first_until)} tokens"
        if self.mesh_above_base_until is not None:
            led += f" and beat base until {_tokens(self.mesh_above_base_until)}"
        against = ", ".join(
            f"{self.change(s) * 100:+.1f}% vs {name}"
            for s, name in (("base", "base"), ("anchor", "anchor"), ("anchor_emb", "anchor*"))
            if s in self.final_ppl
        )
        return [
            f"The decided result is another regime's, not these runs': the one-pass reproduction "
            f"({ONE_PASS_CITED}: {CORPUS} corpus, {_tokens(self.tokens)} tokens per run, {seeds} seeds per scheme, "
            f"each scheme at its own LR), where MeSH ended rank {self.mesh_rank_at_end} of {len(self.final_ppl)} "
            f"(its mean final PPL {against}, a ratio of means; the paired tests are in its claims.md); {led} (curves on the {self.common_seeds} seeds every scheme ran). "
            f"Its verdicts: {ONE_PASS_CITED}/schemes/claims.md.",
        ]


def later_training(folder: Path = ONE_PASS) -> LaterTraining | None:
    """The one-pass grid's numbers from ``runs.csv`` and ``curves.csv`` in ``folder``; None where
    they are not there (an installed package without the committed reports)."""
    runs_csv, curves_csv = folder / "runs.csv", folder / "curves.csv"
    if not runs_csv.is_file() or not curves_csv.is_file():
        return None
    runs = pd.read_csv(runs_csv)
    runs = runs[runs["status"] == "FINISHED"]
    final = runs.groupby("scheme")[PPL].mean()
    if "mesh" not in final.index:
        return None
    seed_sets = [set(group["seed"]) for _, group in runs.groupby("scheme")]
    common = set.intersection(*seed_sets)
    kept = runs[runs["seed"].isin(common)]
    curves = pd.read_csv(curves_csv)
    curves = curves[(curves["metric"] == PPL) & curves["run_id"].isin(kept["run_id"])]
    means = curves.groupby(["tokens", "scheme"])["value"].mean().unstack("scheme").sort_index()
    led = means.index[means.idxmin(axis=1) == "mesh"]
    below_base = means.index[means["mesh"] < means["base"]] if "base" in means else means.index[:0]
    return LaterTraining(
        tokens=float(runs["tokens_planned"].max()),
        seeds={str(k): int(v) for k, v in runs.groupby("scheme").size().items()},
        final_ppl={str(k): float(v) for k, v in final.items()},
        common_seeds=len(common),
        mesh_first_until=float(led.max()) if len(led) else None,
        mesh_above_base_until=float(below_base.max()) if len(below_base) else None,
    )


def later_training_lines(folder: Path = ONE_PASS) -> list[str]:
    """The line naming the decided result and where it is (:meth:`LaterTraining.lines`)."""
    found = later_training(folder)
    if found is None:
        return [
            f"The decided result is another regime's, not these runs': see the one-pass reproduction ({ONE_PASS_CITED})."
        ]
    return found.lines()


def regime_of(plans: Sequence[RunPlan], seeds: int, train_tokens: int | None) -> Regime:
    """The :class:`Regime` of a grid's run plans (:class:`experiments.plan.RunPlan`)."""
    from mesh_model import count_parameters
    from mesh_model.model import build_model

    by_scheme: dict[str, RunPlan] = {}
    for plan in plans:
        by_scheme.setdefault(str(plan.config.get("scheme", plan.model_config.scheme)), plan)
    first = next(iter(by_scheme.values()))
    return Regime(
        schemes=tuple(by_scheme),
        seeds=seeds,
        steps=first.budget.max_steps,
        tokens=first.budget.total_tokens,
        params_non_embedding=tuple(
            int(count_parameters(build_model(p.model_config))["non_embedding"]) for p in by_scheme.values()
        ),
        train_tokens=train_tokens,
        corpus=str(first.data.corpus),
        lrs=tuple(sorted({float(p.peak_lr) for p in plans})),
    )


__all__ = ["LaterTraining", "Regime", "later_training", "later_training_lines", "regime_of"]
