"""The note a report leaves on a sweep's parent run: what it holds, and how it fits MLflow's limit.

The whole path (a real grid, ``build_report``, the note and artifacts read back through the MLflow
client) is tested in tests/test_main_job.py; this file checks the note's text on its own.
"""

from __future__ import annotations

from datetime import datetime

from results.publish import NOTE_LIMIT, report_note

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


def test_note_holds_the_table_then_the_claims_summary_and_its_test():
    note = report_note("schemes", TABLE, CLAIMS, WHEN)
    assert note.startswith("**Results: `mesh-results schemes`**, 2026-12-01 15:00.")
    assert TABLE.strip() in note
    assert note.index(TABLE.strip()) < note.index("### The paper's claims")
    assert "| `mesh_below_base` | tiny | `mesh` vs `base` | `val_ppl` | holds |" in note
    assert note.endswith("* **Test**: two-sided t-test over seeds (paired t).")
    assert "details that stay in claims.md" not in note


def test_note_without_claims_is_the_table():
    note = report_note("schemes", TABLE, None, WHEN)
    assert note.rstrip().endswith("| mesh | 48.1 ± 0.2 (n=3) |") and "claims" not in note.split("artifacts")[1]


def _table_of_length(length: int) -> str:
    rows, i = TABLE, 0
    while len(rows) < length:
        rows += f"| scheme{i} | {i}.0 |\n"
        i += 1
    return rows


def test_a_note_over_mlflows_limit_drops_the_claims_first():
    table = _table_of_length(NOTE_LIMIT - 400)  # fits alone, not with the claims
    assert len(report_note("schemes", table, None, WHEN)) <= NOTE_LIMIT
    note = report_note("schemes", table, CLAIMS, WHEN)
    assert "### The paper's claims" not in note and table.strip() in note and "cut to" not in note


def test_a_table_over_mlflows_limit_is_cut_at_a_row_and_says_where_the_rest_is():
    note = report_note("schemes", _table_of_length(2 * NOTE_LIMIT), CLAIMS, WHEN)
    assert len(note) <= NOTE_LIMIT
    assert "### The paper's claims" not in note
    assert note.endswith("*(cut to MLflow's 8000 characters: see `report/table.md`)*")
    last_row = note.rsplit("\n\n*(cut", 1)[0].splitlines()[-1]
    assert last_row.startswith("| scheme") and last_row.endswith(".0 |")
