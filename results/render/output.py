"""What a report wrote (its paths) with the rows and decided claims it was written from: what
``report.md`` links to and the parent runs carry."""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from pathlib import Path

from results.rows.aggregate import Results
from results.verdicts.claims import Evaluation
from results.verdicts.sequential import DesignRecord


@dataclass
class Output:
    """What :func:`build_report` wrote (paths) and the aggregated results."""

    out_dir: Path
    report: Path
    results: Results
    tables: list[Path] = field(default_factory=list)
    figures: dict[str, list[Path]] = field(default_factory=dict)
    runs_csv: Path | None = None
    curves_csv: Path | None = None  # every validation step of every run (results/verdicts/over_training.py)
    routing_csv: Path | None = None  # the routing curves of every looped run (results/render/routing.py)
    claims: Path | None = None
    evaluations: list[Evaluation] = field(default_factory=list)
    published: list[str] = field(default_factory=list)  # the sweep parent runs that now carry the report
    published_pages: list[str] = field(default_factory=list)  # their pages in the MLflow UI
    published_to: str = "report"  # under which artifact folder of theirs (results.publish.parents.ARTIFACT_DIR)
    experiment_ids: dict[str, str] = field(default_factory=dict)  # name -> id of the experiments read
    view: str | None = None  # the grouped view written to those experiments (experiments.store.views)
    lr_section: list[str] = field(default_factory=list)  # each variant's best LR, where LRs vary
    depth_section: list[str] = field(default_factory=list)  # the loop count at test time (results/render/depth.py)
    opening: list[str] = field(default_factory=list)  # what report.md, claims.md and the parents open with
    design: DesignRecord | None = None  # the seeds=auto design whose decisions are the primary verdicts
    folder_name: str = ""  # the report folder's own name (out_dir is written beside it, then moved)
    declared: dict | None = None  # the reproduction's confirmatory family (confirmatory.yaml), if any

    def moved_to(self, out_dir: Path) -> Output:
        """The same output with every path under :attr:`out_dir` moved under ``out_dir``."""

        def move(path: Path) -> Path:
            return out_dir / path.relative_to(self.out_dir)

        return replace(
            self,
            out_dir=out_dir,
            report=move(self.report),
            tables=[move(p) for p in self.tables],
            figures={k: [move(p) for p in paths] for k, paths in self.figures.items()},
            runs_csv=self.runs_csv and move(self.runs_csv),
            curves_csv=self.curves_csv and move(self.curves_csv),
            routing_csv=self.routing_csv and move(self.routing_csv),
            claims=self.claims and move(self.claims),
            design=self.design
            and (
                replace(self.design, log=move(self.design.log))
                if self.design.log.is_relative_to(self.out_dir)
                else self.design
            ),
        )


__all__ = ["Output"]
