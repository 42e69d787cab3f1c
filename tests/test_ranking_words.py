"""The ranking's verdict column for a row no claim sets against base: says so, and names the claims
that test the row against other rows, where claims.md says how it compares."""

from __future__ import annotations

from types import SimpleNamespace

from results.verdicts.ranking import NO_CLAIM, verdict

PPL = "val/pile/ppl"


def evaluation(claim: str, row, others, verdict_text: str = "holds", metric: str = PPL):
    lines = [SimpleNamespace(other=o) for o in others]
    kind = SimpleNamespace(id=claim, kind="pairwise")
    return SimpleNamespace(
        claim=kind, supplementary=False, metric=metric, row=row, lines=lines, verdict_text=verdict_text
    )


def test_the_best_row_untested_against_base_names_the_claims_that_test_it():
    base, anchor, anchor_emb, mesh = (SimpleNamespace(label=x) for x in ("base", "anchor", "anchor_emb", "mesh"))
    claims = [
        evaluation("mesh_below_base", mesh, [base]),
        evaluation("mesh_below_anchor", mesh, [anchor], "contradicted"),
        evaluation("mesh_best_of_skips", mesh, [anchor, anchor_emb]),
        evaluation("mesh_below_anchor_loss", mesh, [anchor], metric="val/pile/loss"),  # not the key metric
    ]
    said = verdict(anchor, base, claims, {PPL})
    assert said == f"{NO_CLAIM}; tested against other rows in `mesh_below_anchor`, `mesh_best_of_skips`"
    assert NO_CLAIM == "Δ described, not tested: no claim sets this row against base"
    assert verdict(mesh, base, claims, {PPL}) == "`mesh_below_base`: holds"
    assert verdict(SimpleNamespace(label="residual"), base, claims, {PPL}) == NO_CLAIM
    assert verdict(base, base, claims, {PPL}) == "reference"


def test_a_claim_that_compared_nothing_is_not_named():
    """A claim left "not tested" (its other row is absent: an LR grid of MeSH rows alone) has no
    lines, and the ranking does not send the reader to it."""
    base, mesh = SimpleNamespace(label="base"), SimpleNamespace(label="mesh lr=0.008")
    untested = [evaluation("mesh_below_base", mesh, []), evaluation("mesh_below_anchor", mesh, [])]
    assert verdict(mesh, base, untested, {PPL}) == NO_CLAIM


def test_every_delta_the_ranking_prints_names_the_test_behind_it_with_the_p_the_table_prints():
    """Before: residual vs base showed a p in the table and "not tested" in the ranking."""
    from test_claims import runs_frame

    from results.rows.aggregate import aggregate
    from results.verdicts.engine import evaluate
    from results.verdicts.ranking import ranked_cells
    from results.verdicts.schema import load_claims

    frame = runs_frame(
        {
            ("tiny", "base", "1+2R2+1", ""): {"ppl": [120.0, 121.0, 124.0]},
            ("tiny", "residual", "1+2R2+1", ""): {"ppl": [100.0, 102.0, 103.0]},
        }
    )
    results = aggregate(frame)
    block = results.blocks[0]
    cells = {row.scheme: said for row, _, _, said in ranked_cells(results, block, evaluate(results, load_claims()))}
    residual = next(r for r in block.rows if r.scheme == "residual")
    comparison = residual.compare(next(r for r in block.rows if r.scheme == "base"), results.ppl_metric)
    assert cells["residual"] == (
        f"Δ by {comparison.test} on log PPL, p {comparison.p:.2g} (uncorrected: no claim sets this row against base)"
    )
    assert cells["base"] == "reference"
