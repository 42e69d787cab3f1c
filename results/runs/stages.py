"""The design's decisions are the verdicts: a ``seeds=auto`` grid reported by the test that chose its seeds.

A ``seeds=auto`` grid (results/commands/seeds_auto.py) adds seeds in stages and stops each primary claim by
the group-sequential design of results/stats/sequential.py. Its report must say what that design
decided, not what a fixed-sample test run afterwards on data whose size the design chose would say
(that test's error rate is not the one its header promises). :func:`apply_design` replaces the
verdict of each primary pairwise evaluation the design covers by the design's decision at the look
where it stopped (*holds* / *contradicted* / *stopped for futility* / *undecided at the cap*), with
the stage, n and the repeated confidence interval; the fixed-n verdict stays beside it as a labelled
secondary view (``Evaluation.fixed_verdict``).

The design is read from the structured record the grid logs on its parent run, ``stages.json``
(``{"design": seeds.*, "claims": the primary claims it decided, "stages": each stage's seeds and
decisions, "stopped": why}``: :mod:`results.commands.seeds_auto`), kept beside the report;
:func:`read_design_log` reads the design of a grid run before that record named its claims from the
``mesh-sweep ... seeds=auto`` output instead (``seeds_auto.log``), once, to write its ``stages.json``. :func:`read_confirmatory` reads ``confirmatory.yaml`` from the reproduction's folder:
which report is the confirmatory test of which claims; every other report shows them as
replications.
"""

from __future__ import annotations

import json
import re
import shlex
from collections.abc import Iterable
from pathlib import Path

import yaml

from results.rows.frame import ResultsError
from results.verdicts.sequential import LOG, DesignRecord
from sweeps.grid import AutoSeeds, split_auto_seeds

CONFIRMATORY = "confirmatory.yaml"


STAGES = "stages.json"


def read_stages(folder: str | Path) -> DesignRecord | None:
    """The design recorded in ``folder``'s ``stages.json`` (None when there is none)."""
    path = Path(folder) / STAGES
    if not path.is_file():
        return None
    try:
        document = json.loads(path.read_text())
        design = {k: v for k, v in document["design"].items() if k in AutoSeeds.__dataclass_fields__}
        claims = document.get("claims") or sorted(
            {v["claim"] for stage in document.get("stages", []) for v in stage.get("verdicts", [])}
        )
        family, ran = document.get("family"), document.get("ran_family")
        return DesignRecord(
            AutoSeeds(**design),
            tuple(claims),
            path,
            int(family) if family else None,
            int(ran) if ran else None,
            str(document.get("note", "")),
            _recorded_decisions(document, path.parent),
        )
    except (ValueError, KeyError, TypeError) as error:
        raise ResultsError(f"{path}: not a seeds=auto stages record ({type(error).__name__}: {error})") from None


def read_design(folder: str | Path) -> DesignRecord | None:
    """The design that chose the seeds of the report in ``folder``: its ``stages.json``; else, for a
    grid of before that record, the ``seeds_auto.log`` beside it (:func:`read_design_log`)."""
    folder = Path(folder)
    return read_stages(folder) or read_design_log(folder / LOG)


def read_design_log(path: str | Path) -> DesignRecord | None:
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
    return DesignRecord(auto or AutoSeeds(), claims, path, logged=logged_decisions(path))


def read_confirmatory(folder: str | Path) -> dict[str, object] | None:
    """``confirmatory.yaml`` of the reproduction folder above a report (None when there is none):
    ``{"report": <folder name>, "claims": [...], "replications": [...], "second_readings": [...]}``:
    a replication tests the claims on new runs, a second reading reads the confirmatory grid's own
    runs again (another report over the same experiment)."""
    path = Path(folder).parent / CONFIRMATORY
    if not path.is_file():
        return None
    data = yaml.safe_load(path.read_text()) or {}
    return {
        "report": str(data.get("report", "")),
        "claims": [str(c) for c in data.get("claims", [])],
        "replications": [str(r) for r in data.get("replications", [])],
        "second_readings": [str(r) for r in data.get("second_readings", [])],
        "path": path,
    }


_LOGGED = re.compile(r"^(\w+)\s+(\d+)\s+[+-]?[\d.]+\s+\S+\s+\S+\s+(\w+)\s+\(", re.MULTILINE)


def logged_decisions(path: Path) -> tuple[tuple[str, int, str], ...]:
    """What the grid's driver decided when it ran, claim by claim: (claim, n, decision) at its first
    decision other than continue (else the last it logged), from the tables of ``seeds_auto.log``;
    empty when no log is kept."""
    if not path.is_file():
        return ()
    return _first_decisions((m.group(1), int(m.group(2)), m.group(3)) for m in _LOGGED.finditer(path.read_text()))


def _recorded_decisions(document: dict, folder: Path) -> tuple[tuple[str, int, str], ...]:
    """:func:`logged_decisions` from a ``stages.json`` already read: its stages' verdicts, or the log
    beside a record written once from it (whose stages are empty)."""
    found = [
        (str(v["claim"]), int(v["n"]), str(v["verdict"]))
        for st in document.get("stages", [])
        for v in st.get("verdicts", [])
    ]
    return _first_decisions(found) if found else logged_decisions(folder / LOG)


def _first_decisions(found: Iterable[tuple[str, int, str]]) -> tuple[tuple[str, int, str], ...]:
    decided: dict[str, tuple[int, str]] = {}
    for claim, n, verdict in found:
        if claim not in decided or decided[claim][1] == "continue":
            decided[claim] = (n, verdict)
    return tuple((claim, n, verdict) for claim, (n, verdict) in decided.items())
