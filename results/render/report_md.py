"""The Markdown of ``report.md``: the ranking and the paper's claims first, then the tables, the
figures and the probes; how the numbers were made (what was run, the regime, what was left out)
once, at the end. :func:`render_report` writes it, whole, from what :func:`results.pipeline.write_report`
computed and drew."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import pandas as pd

from results.render import formats as render
from results.render import routing, tables
from results.render.claims_md import family_lines, sign_flip_lines, summary_table
from results.render.design import design_lines
from results.render.formats import markdown_escape
from results.render.output import Output
from results.render.ranking import ranking
from results.rows.aggregate import Results
from results.rows.frame import READ_ERROR
from results.stats.comparison import ALPHA, METHOD
from results.verdicts.sequential import LOG


def _over_training(results: Results, output: Output) -> list[str]:
    out = output.out_dir
    lines = []
    for block in results.blocks:
        image = _image(output.figures.get(f"val_ppl/{block.name}", []), out, f"validation PPL, {block.name}")
        if image:
            lines += [f"**{markdown_escape(block.name)}**: validation PPL over training.", "", image, ""]
    deltas = sorted(k.removeprefix("delta/") for k in output.figures if k.startswith("delta/"))
    for claim in deltas:
        image = _image(output.figures[f"delta/{claim}"], out, f"Δ {claim}")
        lines += [f"**`{claim}`**: the claim's Δ in validation loss (log PPL) over training.", "", image, ""]
    if not lines:
        return []
    csv = f"[{output.curves_csv.name}]({_rel(output.curves_csv, out)})" if output.curves_csv else "curves.csv"
    claims = f"[{output.claims.name}]({_rel(output.claims, out)})" if output.claims else "claims.md"
    return ["", OVER_TRAINING, "", _over_training_intro(csv, claims), "", *lines[:-1]]


OVER_TRAINING = "## Over training (descriptive)"


def _over_training_intro(csv: str, claims: str) -> str:
    return (
        f"Every validation step of every run is in {csv} (tokens = step × tokens per step). Curves: the mean "
        "over a row's seeds with its 95% t interval (band, where n ≥ 2), log y. Δ: claimed row − other in "
        "validation loss with its 95% CI, at the same tokens for every row. Descriptive: the CIs are "
        "unadjusted across the steps and no verdict is drawn from them; where along training each CI lay is "
        f'in {claims}, "Over training (descriptive)".'
    )


def _rel(path: Path, out: Path) -> str:
    return path.relative_to(out).as_posix()


def _image(path_list: list[Path], out: Path, alt: str) -> str:
    png = next((p for p in path_list if p.suffix == ".png"), None)
    svg = next((p for p in path_list if p.suffix == ".svg"), None)
    if png is None:
        return ""
    extra = f" ([SVG]({_rel(svg, out)}))" if svg else ""
    return f"![{alt}]({_rel(png, out)}){extra}"


def _values(series: pd.Series) -> list[str]:
    return sorted({str(v) for v in series if str(v) not in ("", "nan", "None")}, key=_natural)


def _natural(text: str) -> tuple:
    try:
        return (0, float(text), text)
    except ValueError:
        return (1, 0.0, text)


def _md_list(values: list[str], empty: str = "—") -> str:
    return ", ".join(f"`{v}`" for v in values) if values else empty


def _what_was_run(results: Results, experiments: Sequence[str], tracking_uri: str, filter_string: str) -> list[str]:
    runs = results.runs
    counts = runs["status"].value_counts().to_dict()
    finished = runs[runs["status"] == "FINISHED"]
    params = [p for p in finished["params"] if isinstance(p, dict)]
    steps = sorted({p["max_steps"] for p in params if "max_steps" in p}, key=_natural)
    corpora = sorted({p["data.corpus"] for p in params if "data.corpus" in p})
    commits = _values(runs["git_commit"])
    status = ", ".join(f"{counts.get(s, 0)} {s.lower()}" for s in ("FINISHED", "FAILED", "RUNNING", "KILLED"))
    others = {s: c for s, c in counts.items() if s not in ("FINISHED", "FAILED", "RUNNING", "KILLED")}
    status += "".join(f", {c} {s.lower()}" for s, c in others.items())
    lines = [
        f"* **Experiments**: {_md_list(sorted(runs['experiment'].unique()))}"
        + (f", filter `{filter_string}`" if filter_string else ""),
        f"* **Runs**: {len(runs)} ({status}); {len(results.rows)} rows in {len(results.blocks)} block{'s' if len(results.blocks) != 1 else ''}",
        f"* **Presets**: {_md_list(_values(finished['preset']))}; **layouts**: {_md_list(_values(finished['layout']))}",
        f"* **Schemes**: {_md_list(_values(finished['scheme']))}",
    ]
    slots = _values(finished["buffer_slots"])
    if slots:
        lines.append(f"* **B** (MeSH buffer slots): {_md_list(slots)}")
    lines += [
        f"* **Steps** (`max_steps`): {_md_list(steps, 'not logged')}; **seeds**: {_md_list(_values(finished['seed']))}",
        f"* **Data**: {_md_list(corpora, 'not logged')}; validation sets: {_md_list(results.sets)}",
    ]
    if results.group_keys:
        lines.append(f"* **Other settings that differ between rows**: {_md_list(results.group_keys)}")
    dirty = any(c.endswith("-dirty") for c in commits)
    lines.append(
        f"* **Commit**: {_md_list([c[:12] + ('-dirty' if c.endswith('-dirty') else '') for c in commits], 'not logged')}"
        + (" (uncommitted changes in the working tree)" if dirty else "")
        + (" — **runs come from more than one commit**" if len(commits) > 1 else "")
    )
    lines.append(f"* **Store**: `{tracking_uri}`; key metric `{results.metric}`")
    unread = runs[runs[READ_ERROR].fillna("").astype(str) != ""] if READ_ERROR in runs else runs.iloc[:0]
    for _, run in unread.iterrows():  # what of a run could not be read back: its values are missing here
        lines.append(f"* **Not read back** from run `{run['run_name']}` (`{run['run_id']}`): {run[READ_ERROR]}")
    return lines


def _regime(results: Results) -> list[str]:
    """Tokens per parameter (with and without embeddings) and passes over the training split, per
    preset, with a warning past one pass: over several epochs the runs measure memorisation too."""
    runs = results.runs[results.runs["status"] == "FINISHED"]
    lines = []
    for preset, group in runs.groupby("preset", sort=False):
        train = _largest(group, "data_train_tokens")
        seen = _largest(group, "tokens_planned")
        passes = seen / train if seen is not None and train is not None else None
        epoch = _largest(group, "epoch")
        if seen is None and epoch is not None and train is not None:
            seen, passes = epoch * train, epoch  # Lightning's 0-based counter: at least this many full passes
        line = f"* **{markdown_escape(str(preset))}**: training split {_tokens(train)} tokens"
        if seen is None:
            lines.append(
                line + "; tokens seen not logged (no `tokens_planned` or `epoch`): tokens per parameter unknown"
            )
            continue
        at_least = "≥ " if _largest(group, "tokens_planned") is None else ""
        line += f", seen {at_least}{_tokens(seen)}"
        for key, label in (("params_non_embedding", "non-embedding"), ("params_total", "total")):
            params = _columns(group, key)
            if params:
                low, high = seen / max(params), seen / min(params)
                span = f"{low:.1f}" if round(low, 1) == round(high, 1) else f"{low:.1f}–{high:.1f}"
                line += f"; {at_least}{span} tokens per {label} parameter"
        line += f"; {at_least}{passes:.2f} passes over the training split"
        if passes is not None and passes > 1:
            line += (
                " — **more than one pass: the models see their training data again, so validation PPL "
                "also measures how well they memorise it**"
            )
        lines.append(line)
    return lines


def _largest(group: pd.DataFrame, key: str) -> float | None:
    """The largest finite value of ``key`` over the runs (None when no run logged it)."""
    values = _columns(group, key)
    return max(values) if values else None


def _columns(group: pd.DataFrame, key: str) -> list[float]:
    if key not in group:
        return []
    return [float(v) for v in pd.to_numeric(group[key], errors="coerce") if pd.notna(v)]


def _tokens(value: float | None) -> str:
    if value is None:
        return "?"
    for size, unit in ((1e9, "B"), (1e6, "M"), (1e3, "k")):
        if value >= size:
            return f"{value / size:.2f}{unit}"
    return f"{value:.0f}"


def _run_table(runs: pd.DataFrame, note_column: str) -> list[str]:
    lines = ["| run | experiment | preset | scheme | layout | B | seed | note |", "|---|---|---|---|---|---|---|---|"]
    for _, run in runs.iterrows():
        note = str(run.get(note_column) or run.get("pruned") or "").splitlines()
        note_text = markdown_escape((note[0] if note else "")[:200])
        cells = [run["run_name"] or run["run_id"], run["experiment"], run["preset"], run["scheme"], run["layout"]]
        cells += [run["buffer_slots"], run["seed"]]
        lines.append("| " + " | ".join(markdown_escape(str(c)) for c in cells) + f" | {note_text} |")
    return lines


def _what_the_numbers_are(results: Results) -> list[str]:
    runs = results.runs
    lines = [
        "### What the numbers are, and what was left out",
        "",
        "* Only FINISHED runs are averaged. Each cell is the mean ± the **sample** standard deviation (ddof=1) "
        "over the seeds of its row, with n the number of runs averaged.",
        f"* Every difference between two rows carries its test: {METHOD}. Bold and underlined cells rank "
        f"means only; p ≥ {ALPHA} does not show two rows equal: claims.md says what the seeds could detect "
        "(MDE) and which differences are shown equivalent (TOST).",
    ]
    rows = results.rows
    single = [r for r in rows if r.n == 1]
    if single:
        lines.append(
            f"* **single seed: no spread shown** for {len(single)} of {len(rows)} rows "
            f"({', '.join(f'`{r.label}`' for r in single[:12])}{', ...' if len(single) > 12 else ''})."
        )
    if results.duplicates:
        left_out = "; ".join(
            f"`{d.run_name}` (kept `{d.kept_run_name}`, row `{d.row}`, seed {d.seed}, config_hash `{d.config_hash}`)"
            for d in results.duplicates
        )
        lines.append(
            f"* **Duplicates left out** ({len(results.duplicates)}): finished runs with the same `config_hash` and seed "
            f"as a later run of their row are the same model trained twice, counted once (the latest): {left_out}."
        )
    counts = sorted({r.n for r in rows})
    if counts:
        lines.append(f"* Seeds per row: {', '.join(f'n={n}: {sum(r.n == n for r in rows)} rows' for n in counts)}.")
    uneven = []
    for row in rows:
        ns = {m: s.n for m, s in row.stats.items() if not m.startswith(("params_", "flops", "data_", "epoch"))}
        if ns and min(ns.values()) < row.n:
            short = sorted(m for m, n in ns.items() if n < row.n and not m.startswith("probe/"))
            if short:
                uneven.append(f"`{row.label}`: {', '.join(f'`{m}`' for m in short[:6])}")
    if uneven:
        lines.append("* Metrics logged by only some of a row's runs (their n is smaller): " + "; ".join(uneven) + ".")
    for status, title, column in (
        ("FAILED", "Failed runs", "error"),
        ("RUNNING", "Unfinished runs (status RUNNING: still running, or stopped without closing)", "error"),
        ("KILLED", "Killed runs (interrupted, or pruned by the search)", "pruned"),
    ):
        subset = runs[runs["status"] == status]
        lines += ["", f"#### {title}: {len(subset)}", ""]
        if len(subset):
            lines += ["Not averaged into any cell.", "", *_run_table(subset, column)]
        else:
            lines.append("None.")
    other = runs[~runs["status"].isin(["FINISHED", "FAILED", "RUNNING", "KILLED"])]
    if len(other):
        lines += ["", f"#### Runs in other states: {len(other)}", "", *_run_table(other, "error")]
    return lines


def render_report(
    *,
    name: str,
    experiments: Sequence[str],
    tracking_uri: str,
    filter_string: str,
    results: Results,
    main: tables.Table,
    probes: tables.Table | None,
    output: Output,
    probe_figures: dict[str, dict[str, list[Path]]],
    probe_seeds: dict[str, str],
) -> str:
    """The answer first (the ranking, then the claims' verdicts), then the main table, the figures
    and the probes; how the numbers were made once, at the end (Methods); the wide probe table in
    an appendix."""
    out = output.out_dir
    lines = [
        f"# Results: {markdown_escape(name)}",
        "",
        f"Generated by `mesh-results` from {render.runs_ended(results.runs)}; the folder keeps the data it is "
        "made from (`python -m results.commands.reports FOLDER` writes it again). Tables: "
        + ", ".join(f"[{p.name}]({_rel(p, out)})" for p in output.tables)
        + (f"; every run: [{output.runs_csv.name}]({_rel(output.runs_csv, out)})" if output.runs_csv else "")
        + (f"; the paper's claims tested: [{output.claims.name}]({_rel(output.claims, out)})" if output.claims else "")
        + "; how the numbers were made: [Methods](#methods).",
        *render.quote_lines(output.opening),
    ]
    ranked = ranking(results, output.evaluations)
    if ranked:
        lines += ["", "## Ranking", "", *ranked]
    if output.lr_section:
        lines += ["", *output.lr_section]
    if output.depth_section:
        lines += ["", *output.depth_section]
    if output.evaluations:
        lines += claims_section(output, out)
    lines += ["", "## Main table", ""]
    if results.rows:
        lines.append(render.to_markdown(main, heading="###", notes=False).rstrip())
        if not any(row.paper for row in results.rows):
            lines += ["", "No row matches a row of the paper (same preset, scheme and layout), so no paper column."]
    else:
        lines.append("No finished run: nothing to tabulate.")

    figure_lines = []
    for key, alt, caption in (
        ("ranking", "ranking", "The ranking: each row's seeds (dots) and mean (bar), best on top."),
        ("ppl_vs_params", "PPL vs non-embedding parameters", "PPL against non-embedding parameters (% of vanilla)."),
        ("buffer_slots", "PPL vs B", "MeSH: PPL against the number of buffer slots B (error bars: sample std)."),
        (
            "train_loss",
            "training loss",
            "Training loss, each run smoothed by a trailing rolling mean over 1/10 of its logged steps (the "
            "window is on the axis), then the mean over seeds (band: ± sample std where n ≥ 2).",
        ),
    ):
        image = _image(output.figures.get(key, []), out, alt)
        if image:
            figure_lines += [f"**{caption}**", "", image, ""]
    if figure_lines:
        lines += ["", "## Figures", "", *figure_lines]
        lines.pop()

    lines += _over_training(results, output)

    if probes is not None or probe_figures:
        lines += ["", "## Probes", ""]
        if probes is not None:
            csv = next((p for p in output.tables if p.name == "probes.csv"), None)
            lines.append(
                "The probe table, every probe per row with its tests against base, is in the "
                "[appendix](#appendix-the-probe-table)" + (f" and [{csv.name}]({_rel(csv, out)})" if csv else "") + "."
            )
        for block, paths in probe_figures.items():
            drawn = ", ".join(
                f"`{label}` seed {seed}" for label, seed in probe_seeds.items() if label in _labels(results, block)
            )
            lines += ["", f"### Probe figures: {markdown_escape(block)}", "", f"One run per row ({drawn}).", ""]
            for kind, alt in (
                ("updates", "update magnitude"),
                ("cka_rbf", "CKA (RBF)"),
                ("spectra", "spectra"),
                ("routing", "MoE routing per loop iteration"),
            ):
                if kind in paths:
                    lines += [_image(paths[kind], out, alt), ""]
            if "cka_linear" in paths:
                png = next(p for p in paths["cka_linear"] if p.suffix == ".png")
                lines.append(f"Linear CKA: [{png.name}]({_rel(png, out)})")
    routed = {k.removeprefix("routing/"): v for k, v in output.figures.items() if k.startswith("routing/")}
    lines += routing.routing_section(
        routed, output.routing_csv, lambda paths, alt: _image(paths, out, alt), lambda p: _rel(p, out)
    )
    lines += ["", *_methods(results, experiments, tracking_uri, filter_string, [main, probes], design_section(output))]
    if probes is not None:
        lines += [
            "",
            "## Appendix: the probe table",
            "",
            render.to_markdown(probes, heading="###", notes=False).rstrip(),
        ]
    lines += routing.appendix(results)
    return "\n".join(lines).rstrip() + "\n"


def claims_section(output: Output, out: Path) -> list[str]:
    """``## The paper's claims``: how the verdicts were reached, then one line per evaluation."""
    link = f"[{output.claims.name}]({_rel(output.claims, out)})" if output.claims else "claims.md"
    if output.design is not None:
        how = (
            f"The primary claims' verdicts are the decisions of the group-sequential design that chose the seeds "
            f"(`seeds=auto`; stage, n and repeated confidence interval, see [Methods](#methods)); the secondary "
            f"claims: α = {ALPHA}, Benjamini-Hochberg; the fixed-n analysis of the primary claims (Holm) is a "
            f"secondary view in {link}."
        )
    else:
        how = (
            f"Each claim of the paper tested on these runs (α = {ALPHA}; Holm across the primary claims, "
            "Benjamini-Hochberg across the secondary; TOST for equivalence at the family's level)."
        )
    return [
        "",
        "## The paper's claims",
        "",
        how + f" The rules and the numbers behind every verdict are in {link}.",
        *(["", *family_lines(output.declared, output.folder_name or out.name)] if output.declared else []),
        *(["", *flips] if (flips := sign_flip_lines(output.evaluations, f"under its claim in {link}")) else []),
        "",
        *summary_table(output.evaluations),
    ]


def design_section(output: Output) -> list[str]:
    """``### The sequential design``: bounds, looks, spending, cap, and where the stages are logged."""
    if output.design is None:
        return []
    name = output.design.log.name
    what = (
        "the output of `mesh-sweep ... seeds=auto`" if name == LOG else "the record the grid logged on its parent run"
    )
    log = f"[`{name}`]({name}) ({what}: every stage, its seeds and its decisions)"
    return ["### The sequential design", "", *design_lines(output.design, log, output.evaluations), ""]


def _methods(
    results: Results,
    experiments: Sequence[str],
    tracking_uri: str,
    filter_string: str,
    shown: Sequence[tables.Table | None],
    design: list[str] | None = None,
) -> list[str]:
    """What was run, the regime, what the numbers are (the notes of the ``shown`` tables, each once;
    the cells and the tests are said by :func:`_what_the_numbers_are`) and the runs left out."""
    lines = [
        "## Methods",
        "",
        *(design or []),
        "### What was run",
        "",
        *_what_was_run(results, experiments, tracking_uri, filter_string),
    ]
    regime = _regime(results)
    if regime:
        lines += ["", "### The regime: tokens per parameter and passes over the data", "", *regime]
    honesty = _what_the_numbers_are(results)
    notes = [n for t in shown if t is not None for n in t.notes if n not in (tables.CELL_NOTE, tables.TEST_NOTE)]
    end = next((i for i in range(2, len(honesty)) if honesty[i] == ""), len(honesty))  # its bullets end
    lines += [
        "",
        *honesty[:end],
        *([render.notes_markdown(list(dict.fromkeys(notes)))] if notes else []),
        *honesty[end:],
    ]
    return lines


def _labels(results: Results, block_name: str) -> set[str]:
    return {r.label for b in results.blocks if b.name == block_name for r in b.rows}
