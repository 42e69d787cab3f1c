"""The note a report leaves on a sweep's parent run: what it holds, and how it fits MLflow's limit.

The whole path (a real grid, ``build_report``, the note and artifacts read back through the MLflow
client) is tested in tests/test_main_job.py; this file checks the note's text on its own.
"""

from __future__ import annotations

from datetime import datetime

from results.publish.parents import NOTE_LIMIT, report_note

TABLE = "## Results\n\n| scheme | PPL |\n|---|---:|\n| base | 49.9 ± 0.1 (n=3) |\n| mesh | 48.1 ± 0.2 (n=3) |\n"
CLAIMS = """# The paper's claims

* **Test**: two-sided t-test over seeds (paired t).
* **Verdicts**: holds, ...

## Summary

| claim | block | rows | metric | verdict |
|---|---|---|---|---|
| `mesh_below_base` | tiny | `mesh` vs `base` | `val_ppl` | holds |

## `mesh_below_base`

details that stay in claims.md
"""
WHEN = datetime(2026, 12, 1, 15, 0)


RANKING = [
    "**tiny, compute depth 6**: validation PPL (pile), lower is better",
    "",
    "| # | row | mean ± sd (n) | Δ vs base [95% CI] | verdict |",
    "|---:|---|---:|---:|---|",
    "| 1 | `mesh` | 48.1 ± 0.2 (n=3) | -1.8 [-2.3, -1.3] | `mesh_below_base`: holds |",
    "| 2 | `base` | 49.9 ± 0.1 (n=3) | — | reference |",
]


def test_note_starts_with_the_ranking_then_says_where_the_report_is_then_the_claims_and_the_table():
    note = report_note("schemes", TABLE, CLAIMS, WHEN, RANKING)
    assert note.startswith("\n".join(RANKING))
    head = "**Results: `mesh-results schemes`**, 2026-12-01 15:00."
    assert note.index(RANKING[-1]) < note.index(head) < note.index("### The paper's claims") < note.index(TABLE.strip())
    assert "| `mesh_below_base` | tiny | `mesh` vs `base` | `val_ppl` | holds |" in note
    assert "* **Test**: two-sided t-test over seeds (paired t)." in note
    assert "details that stay in claims.md" not in note and note.endswith(TABLE.strip())


def test_note_without_claims_or_ranking_is_the_line_and_the_table():
    note = report_note("schemes", TABLE, None, WHEN)
    assert note.startswith("**Results: `mesh-results schemes`**") and "claims" not in note.split("artifacts")[1]
    assert note.rstrip().endswith("| mesh | 48.1 ± 0.2 (n=3) |")


def _table_of_length(length: int) -> str:
    rows, i = TABLE, 0
    while len(rows) < length:
        rows += f"| scheme{i} | {i}.0 |\n"
        i += 1
    return rows


def test_a_note_over_mlflows_limit_keeps_the_ranking_and_the_claims_and_cuts_the_table_at_a_row():
    note = report_note("schemes", _table_of_length(2 * NOTE_LIMIT), CLAIMS, WHEN, RANKING)
    assert len(note) <= NOTE_LIMIT
    assert note.startswith("\n".join(RANKING)) and "### The paper's claims" in note
    assert note.endswith("*(cut to MLflow's 8000 characters: see `report/report.md`)*")
    last_row = note.rsplit("\n\n*(cut", 1)[0].splitlines()[-1]
    assert last_row.startswith("| scheme") and last_row.endswith(".0 |")
