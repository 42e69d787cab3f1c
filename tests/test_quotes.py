"""The reproduction's README quotes no number by hand: it is written from README.template.md, whose
numbers are placeholders resolved from the committed report folders (results/publish/quotes.py).
The page is what its template gives today; a decimal or a percentage typed in the template's prose
is one of a short list, each checked against the file or setting it comes from; and a changed value
in a folder's data changes the page (or fails it, for a quoted file)."""

import re
import shutil
from pathlib import Path

import pandas as pd
import pytest

from experiments.config import OptimConfig
from results.commands import quotes as command
from results.publish import quotes
from results.rows.frame import ResultsError
from results.stats.comparison import ALPHA, CONFIDENCE, log_ratio_text

ROOT = Path(__file__).resolve().parent.parent
REPRO = ROOT / "results" / "cpu-reproduction"
TEMPLATE = REPRO / "README.template.md"
SWEEP = ROOT / "sweeps" / "conf" / "sweep" / "mesh_open_choices.yaml"

# Every decimal and percentage the template's prose types itself, and what it is checked against.
TYPED = {
    "0.05": ALPHA == 0.05,  # α of every test
    "95%": CONFIDENCE == 0.95,  # the intervals' level
    "90%": 1 - 2 * ALPHA == 0.9,  # TOST's interval at α
    "1%": OptimConfig().warmup_fraction == 0.01,  # the recipe's warmup
    "10%": OptimConfig().min_lr_ratio == 0.1,  # cosine to a tenth of the peak
    "0.1": "(collapse: < 0.1)" in (REPRO / "one-pass/open_choices/decision.md").read_text(),
    "0.9": "own slot at weight 0.9" in SWEEP.read_text(),
}
NUMBER = re.compile(r"(?<![\w.])\d+(?:\.\d+)?%|(?<![\w.+-])\d+\.\d+(?![\w.])")


def typed_numbers(template: str) -> set[str]:
    """Decimals and percentages outside placeholders, code and link targets."""
    text = re.sub(r"```.*?```", "", template, flags=re.S)
    text = quotes.PLACEHOLDER.sub("", text)
    text = re.sub(r"`[^`]*`", "", text)
    text = re.sub(r"\]\([^)]*\)", "]", text)
    return set(NUMBER.findall(text))


def test_the_readme_is_what_its_template_gives():
    page, text = quotes.write_page(TEMPLATE)
    assert page == REPRO / "README.md"
    assert page.read_text() == text, (
        "run `make reports` (results/cpu-reproduction/README.md is written from its template)"
    )


def test_numbers_typed_in_the_template_are_the_checked_few():
    found = typed_numbers(TEMPLATE.read_text())
    assert found <= set(TYPED), f"typed by hand, not a placeholder: {sorted(found - set(TYPED))}"
    assert all(TYPED.values()), {k: v for k, v in TYPED.items() if not v}


def test_the_guard_sees_a_typed_number():
    assert typed_numbers("MeSH is 2.8% worse ({{change one-pass/schemes: mesh / base}}), PPL 58.42, `0.2*core`") == {
        "2.8%",
        "58.42",
    }


@pytest.fixture()
def k3(tmp_path: Path) -> Path:
    shutil.copytree(REPRO / "one-pass" / "k3", tmp_path / "k3", ignore=shutil.ignore_patterns("figures", "*.png"))
    return tmp_path


def test_a_changed_value_in_the_data_changes_the_page(k3: Path):
    template = "MeSH {{ppl_n k3: mesh}}, against base {{delta k3: mesh / base}}, p = {{p k3: mesh / base}}"
    before = quotes.render(template, k3)
    assert before == "MeSH 58.97 ± 2.37 (9), against base +1.2% [-2.6%, +5.0%], p = 0.502"
    runs = k3 / "k3" / "runs.csv"
    frame = pd.read_csv(runs, low_memory=False)
    mesh = frame.index[(frame["scheme"] == "mesh") & (frame["seed"] == 0)][0]
    frame.loc[mesh, "val/docs/loss"] += 0.05  # the row's PPL is exp(val loss)
    frame.loc[mesh, "val/docs/ppl"] *= 1.0512710963760241
    frame.to_csv(runs, index=False)
    after = quotes.render(template, k3)
    assert after == "MeSH 59.31 ± 2.65 (9), against base +1.7% [-2.2%, +5.8%], p = 0.346"


def test_a_quoted_file_that_no_longer_says_it_fails(k3: Path):
    template = "t = {{quote k3/seeds_auto.log: -0.0147   «-0.61»}}"
    assert quotes.render(template, k3) == "t = -0.61"
    log = k3 / "k3" / "seeds_auto.log"
    log.write_text(log.read_text().replace("-0.61", "-0.62"))
    with pytest.raises(ResultsError, match="no longer says"):
        quotes.render(template, k3)


def test_delta_is_the_reports_comparison():
    folder = quotes.Folder.read(REPRO / "one-pass" / "schemes")
    mesh = quotes.find_row(folder.results, "mesh")
    base = quotes.find_row(folder.results, "base")
    comparison = mesh.compare(base, folder.results.ppl_metric)
    assert comparison is not None
    assert quotes.render("{{delta one-pass/schemes: mesh / base}}", REPRO) == log_ratio_text(comparison)
    assert "+2.8% \\[-0.7%, +6.5%\\] | 0.104 | paired t (n=9)" in (REPRO / "one-pass/schemes/table.md").read_text()


def test_counts_hours_and_budget_come_from_runs_csv():
    assert quotes.render("{{runs one-pass/schemes}} {{cpu_hours one-pass/schemes}}", REPRO) == "39 7.2"
    assert quotes.render("{{steps one-pass/schemes}} {{tokens one-pass/schemes}}", REPRO) == "2500 5.1M"
    assert quotes.render("{{per_param one-pass/schemes: base}} {{passes one-pass/schemes}}", REPRO) == "25.6 0.44"


@pytest.mark.parametrize(
    ("template", "error"),
    [
        ("{{ppl one-pass/schemes: mesh B7}}", "no row 'mesh B7'"),
        ("{{ppl tiny-moe/../all: vanilla}}", "ambiguous"),
        ("{{pp one-pass/schemes: mesh}}", "no kind 'pp'"),
        ("{{ppl one-pass/schemes mesh", "not a placeholder"),
        ("{{delta one-pass/schemes: mesh}}", "takes 2 row"),
        ("{{quote one-pass/k3/seeds_auto.log: «-0.61» «+0.70»}}", "one «...»"),
    ],
)
def test_a_bad_placeholder_says_what_is_wrong(template: str, error: str):
    with pytest.raises(ResultsError, match=error):
        quotes.render(template, REPRO)


def test_check_lists_a_page_that_differs(tmp_path: Path, capsys):
    template = tmp_path / "PAGE.template.md"
    template.write_text(f"runs: {{{{runs {REPRO / 'one-pass' / 'k3'}}}}}\n")
    assert command.main([str(template), "--check"]) == 1
    assert command.main([str(template)]) == 0
    assert (tmp_path / "PAGE.md").read_text().endswith("runs: 18\n")
    assert command.main([str(template), "--check"]) == 0
