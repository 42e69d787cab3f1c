"""The design's decisions are the verdicts: a ``seeds=auto`` grid reported by the test that chose its seeds.

A ``seeds=auto`` grid (results/commands/seeds_auto.py) adds seeds in stages and stops each primary claim by
the group-sequential design of results/stats/sequential.py. Its report must say what that design
decided, not what a fixed-sample test run afterwards on data whose size the design chose would say
(that test's error rate is not the one its header promises). :func:`apply_design` replaces the
verdict of each primary pairwise evaluation the design covers by the design's decision at the look
where it stopped (*holds* / *contradicted* / *stopped for futility* / *undecided at the cap*), with
the stage, n and the repeated confidence interval; the fixed-n verdict stays beside it as a labelled
secondary view (``Evaluation.fixed_verdict``).

The design is read from the grid's ``seeds_auto.log`` (the ``mesh-sweep ... seeds=auto`` output
run.sh keeps beside the report): the command line gives ``seeds.*`` (stage, cap, alpha, spending,
futility), the header line the primary claims it decided (so the family size m is the one the
design used). :func:`read_confirmatory` reads ``confirmatory.yaml`` from the reproduction's folder:
which report is the confirmatory test of which claims; every other report shows them as
replications.
"""

from __future__ import annotations

import re
import shlex
from pathlib import Path

import yaml

from results.verdicts.sequential import DesignRecord
from sweeps.grid import AutoSeeds, split_auto_seeds

CONFIRMATORY = "confirmatory.yaml"


def read_design(path: str | Path) -> DesignRecord | None:
    """The design of the ``mesh-sweep ... seeds=auto`` run whose output is ``path`` (None when the
    file does not exist or holds no seeds=auto command)."""
    path = Path(path)
    if not path.is_file():
        return None
    text = path.read_text()
    command = next(
        (line for line in text.splitlines() if line.startswith("+ mesh-sweep ") and "seeds=auto" in line), None
    )
    if command is None:
        return None
    auto, _ = split_auto_seeds(shlex.split(command)[3:])
    listed = re.search(r"seeds=auto: \d+ arms, primary claims (.+?); ", text)
    claims = tuple(c.strip() for c in listed.group(1).split(",")) if listed else ()
    return DesignRecord(auto or AutoSeeds(), claims, path)


def read_confirmatory(folder: str | Path) -> dict[str, object] | None:
    """``confirmatory.yaml`` of the reproduction folder above a report (None when there is none):
    ``{"report": <folder name>, "claims": [...], "replications": [...]}``."""
    path = Path(folder).parent / CONFIRMATORY
    if not path.is_file():
        return None
    data = yaml.safe_load(path.read_text()) or {}
    return {
        "report": str(data.get("report", "")),
        "claims": [str(c) for c in data.get("claims", [])],
        "replications": [str(r) for r in data.get("replications", [])],
        "path": path,
    }
