"""Every committed report folder is what its data gives: `make reports` (results.commands.reports)
rebuilt on a copy of each leaves every file byte for byte as committed, figures included."""

from __future__ import annotations

import re

import pytest

from results.commands.reports import ROOT, check_folder, differing_files, report_folders

FOLDERS = report_folders([ROOT])


def test_every_committed_report_has_its_data():
    reports = {p.parent for p in ROOT.rglob("report.md")}
    assert reports and reports == set(FOLDERS)  # no report without the report.json it is rebuilt from
    for folder in FOLDERS:
        assert (folder / "runs.csv").is_file()


@pytest.mark.slow
@pytest.mark.parametrize("folder", FOLDERS, ids=[str(f.relative_to(ROOT)) for f in FOLDERS])
def test_a_committed_report_is_rebuilt_byte_for_byte(folder):
    assert check_folder(folder) == []


def test_differing_files_sees_a_changed_an_added_and_a_missing_file(tmp_path):
    a, b = tmp_path / "a", tmp_path / "b"
    for root in (a, b):
        (root / "figures").mkdir(parents=True)
        (root / "same.md").write_text("x\n")
    (a / "figures" / "f.svg").write_text("<svg/>")
    (b / "figures" / "f.svg").write_text("<svg />")
    (a / "only_a.csv").write_text("1\n")
    (b / "only_b.csv").write_text("1\n")
    assert differing_files(a, b) == ["only_a.csv", "only_b.csv", "figures/f.svg"]


TRENDS = sorted(p.parent for p in ROOT.rglob("trend.json"))


def test_every_committed_trend_is_what_its_report_folders_give():
    # results.commands.trend: trend.md and trend.csv made again from the runs.csv they name (the
    # size-and-tokens study, one-pass/size_tokens) are byte for byte as committed.
    from results.commands.reports import REPO
    from results.commands.trend import differing

    assert TRENDS  # the size-and-tokens trend is committed
    for folder in TRENDS:
        assert differing(folder, REPO) == [], folder


def test_an_mde_past_1000_percent_of_ppl_is_written_as_such_not_in_seventeen_digits():
    """Two seeds and a wild one make the MDE exp(38) - 1 of PPL: the LR sweeps' claims say >1000%."""
    for folder in ("one-pass/lr", "one-pass/lr_disjoint"):
        text = (ROOT / folder / "claims.md").read_text()
        assert "±>1000%" in text and not re.search(r"±\d{5,}", text), folder
