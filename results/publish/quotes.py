"""Numbers a page quotes, written from the committed report folders, never typed.

A page that quotes results (``results/cpu-reproduction/README.md``) is written from a template beside
it (``README.template.md``) in which every number is a placeholder::

    {{ppl one-pass/schemes: mesh}}                  58.42 ± 2.70    (mean ± sd over seeds)
    {{delta one-pass/schemes: mesh / base}}         +2.8% [-0.7%, +6.5%]
    {{quote one-pass/schemes/claims.md: [+0.015, +0.065]}}   the text itself, checked to be in that file

``{{KIND[.DECIMALS] FOLDER[: ARGS]}}``: FOLDER is a report folder under the root (``report.json``,
``runs.csv``), read once and grouped into rows by the same :func:`results.rows.aggregate.aggregate` the
report used; a row is named by words of its label (:func:`find_row`); ``A / B`` names two rows, and
``# METRIC`` after them another metric than the validation PPL. :data:`KINDS` lists every kind. A pair
of rows is compared by :meth:`results.rows.aggregate.Row.compare`, the comparison every report prints.
``quote`` is for a number that only a generated file holds (a design's t, a routing coefficient): the
page shows the text and :func:`render` fails when the file no longer contains it.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import pandas as pd

from results.render.depth import SECTION, SECTION_FILE
from results.render.lr import lr_markdown
from results.rows.aggregate import Results, Row, aggregate
from results.rows.frame import ResultsError
from results.rows.paper import load_paper_numbers
from results.rows.spec import ReportSpec
from results.runs.committed import read_runs_csv
from results.stats.comparison import Comparison, format_p, log_ratio_text
from results.verdicts.lr import lr_curves

TEMPLATE_SUFFIX = ".template.md"
PLACEHOLDER = re.compile(
    r"\{\{(?P<kind>[a-z_]+)(?:\.(?P<decimals>\d))? +(?P<folder>[^\s:}]+)(?: *: *(?P<args>[^}]*?))? *\}\}"
)
HEADER = "<!-- Written by `make reports` from {template}: edit that file, not this one. -->\n"


@dataclass
class Folder:
    """One committed report folder: its runs and its rows, read once."""

    path: Path
    frame: pd.DataFrame  # runs.csv as written: every column, param:* included
    results: Results

    @classmethod
    def read(cls, path: Path) -> Folder:
        if not (path / "runs.csv").is_file():
            raise ResultsError(f"{path}: no runs.csv (a quoted folder is a committed report folder)")
        spec = ReportSpec.read(path)
        frame = read_runs_csv(path / "runs.csv")
        prefer = tuple(spec.experiments) + tuple(s for s in frame["sweep"].unique() if s)
        raw = pd.read_csv(path / "runs.csv", low_memory=False)
        return cls(path, raw, aggregate(frame, spec.metric, load_paper_numbers(None), prefer))

    def finished(self, selectors: str = "") -> pd.DataFrame:
        """The finished runs the rows count (each config and seed once); ``selectors`` (``a / b``):
        only those of the rows that match one of them (every row that does, :func:`find_row`'s words)."""
        groups = [g.strip() for g in selectors.split("/") if g.strip()]
        rows = [row for row in self.results.rows if not groups or any(_matches(g, row) for g in groups)]
        if not rows:
            raise ResultsError(f"no row matches {selectors!r}")
        return self.frame[self.frame["run_id"].isin({run_id for row in rows for run_id in row.run_ids})]


def _words(label: str) -> list[str]:
    return label.split()


def _word_matches(wanted: str, word: str) -> bool:
    """``lr=0.004`` matches ``optim.lr=0.004``; ``mesh_router_z_coef`` matches
    ``model_overrides.mesh_router_z_coef=0.001``."""
    if wanted == word or word.endswith("." + wanted):
        return True
    key, is_setting, _ = word.partition("=")
    return bool(is_setting) and (key == wanted or key.endswith("." + wanted))


def _matches(selector: str, row: Row) -> bool:
    return all(any(_word_matches(w, x) for x in _words(row.label)) for w in selector.split())


def find_row(results: Results, selector: str) -> Row:
    """The row whose label has every word of ``selector``; of several, the one with the fewest words
    (``mesh`` is the plain MeSH row, not ``mesh ... mesh_final_read=residual``). Two as plain: an error."""
    found = [row for row in results.rows if _matches(selector, row)]
    if found:
        fewest = min(len(_words(row.label)) for row in found)
        plainest = [row for row in found if len(_words(row.label)) == fewest]
        if len(plainest) == 1:
            return plainest[0]
        raise ResultsError(f"row {selector!r} is ambiguous: {', '.join(r.label for r in plainest)}")
    raise ResultsError(f"no row {selector!r}; rows: {', '.join(r.label for r in results.rows)}")


@dataclass
class Quote:
    """One placeholder: what it asks for, parsed."""

    kind: str
    folder: str
    args: str
    decimals: int | None
    text: str  # the placeholder as written

    @property
    def metric_and_rows(self) -> tuple[str, list[str]]:
        rows, _, metric = self.args.partition("#")
        return metric.strip(), [r.strip() for r in rows.split("/") if r.strip()]


@dataclass
class Quotes:
    """Resolves placeholders against the folders under ``root``, each folder read once."""

    root: Path
    folders: dict[str, Folder] = field(default_factory=dict)

    def folder(self, name: str) -> Folder:
        if name not in self.folders:
            self.folders[name] = Folder.read(self.root / name)
        return self.folders[name]

    def resolve(self, quote: Quote) -> str:
        kind = KINDS.get(quote.kind)
        if kind is None:
            raise ResultsError(f"{quote.text}: no kind {quote.kind!r}; kinds: {', '.join(sorted(KINDS))}")
        try:
            return kind(self, quote)
        except ResultsError:
            raise
        except (KeyError, ValueError, IndexError) as error:
            raise ResultsError(f"{quote.text}: {error}") from None


def _rows(q: Quotes, quote: Quote, count: int) -> tuple[Results, str, list[Row]]:
    results = q.folder(quote.folder).results
    metric, names = quote.metric_and_rows
    if len(names) != count:
        raise ResultsError(f"{quote.text}: {quote.kind} takes {count} row(s), got {len(names)}")
    return results, metric or results.ppl_metric, [find_row(results, name) for name in names]


def _dec(quote: Quote, default: int) -> int:
    return default if quote.decimals is None else quote.decimals


def _mean(q: Quotes, quote: Quote) -> str:
    _, metric, (row,) = _rows(q, quote, 1)
    return f"{row.stats[metric].mean:.{_dec(quote, 2)}f}"


def _sd(q: Quotes, quote: Quote) -> str:
    _, metric, (row,) = _rows(q, quote, 1)
    return f"{row.stats[metric].std or 0.0:.{_dec(quote, 2)}f}"


def _ppl(q: Quotes, quote: Quote) -> str:
    return f"{_mean(q, quote)} ± {_sd(q, quote)}"


def _ppl_n(q: Quotes, quote: Quote) -> str:
    return f"{_ppl(q, quote)} ({_n(q, quote)})"


def _n(q: Quotes, quote: Quote) -> str:
    _, metric, (row,) = _rows(q, quote, 1)
    return str(row.stats[metric].n)


def _seed(q: Quotes, quote: Quote) -> str:
    """``{{seed F: mesh @ 6}}``: the value of one seed's run."""
    row_name, _, seed = quote.args.partition("@")
    results = q.folder(quote.folder).results
    row = find_row(results, row_name.strip())
    stat = row.stats[results.ppl_metric]
    return f"{dict(zip(stat.seeds, stat.values, strict=True))[seed.strip()]:.{_dec(quote, 2)}f}"


def _ratio(q: Quotes, quote: Quote) -> str:
    """The first row's mean over the second's, minus 1, in % (a description, no pairing)."""
    _, metric, (a, b) = _rows(q, quote, 2)
    return f"{100 * (a.stats[metric].mean / b.stats[metric].mean - 1):+.{_dec(quote, 1)}f}%"


def _comparison(q: Quotes, quote: Quote) -> tuple[Comparison, str]:
    _, metric, (a, b) = _rows(q, quote, 2)
    comparison = a.compare(b, metric)
    if comparison is None:
        raise ResultsError(f"{quote.text}: no {metric} on both rows")
    return comparison, metric


def _delta(q: Quotes, quote: Quote) -> str:
    """The first row minus the second as every report prints it: a PPL's paired log difference as a
    ratio with its 95% CI (:func:`log_ratio_text`), another metric in its units."""
    comparison, metric = _comparison(q, quote)
    if metric.endswith("ppl"):
        return log_ratio_text(comparison)
    return f"{comparison.diff:+.{_dec(quote, 3)}f} [{comparison.ci_low:+.{_dec(quote, 3)}f}, {comparison.ci_high:+.{_dec(quote, 3)}f}]"


def _change(q: Quotes, quote: Quote) -> str:
    """:func:`_delta`'s ratio without its interval: ``+2.8%``."""
    comparison, _ = _comparison(q, quote)
    return f"{100 * math.expm1(comparison.diff):+.{_dec(quote, 1)}f}%"


def _p(q: Quotes, quote: Quote) -> str:
    comparison, _ = _comparison(q, quote)
    if comparison.p is None:
        raise ResultsError(f"{quote.text}: untested ({comparison.reason})")
    return format_p(comparison.p) if quote.decimals is None else f"{comparison.p:.{quote.decimals}f}"


def _runs(q: Quotes, quote: Quote) -> str:
    """Finished runs counted in the folder's rows (``: ROW / ROW``: those rows' only)."""
    return str(len(q.folder(quote.folder).finished(quote.args or "")))


def _cpu_hours(q: Quotes, quote: Quote) -> str:
    """``time/total_s`` summed over the finished runs (of ``: ROW / ROW``), in hours."""
    runs = q.folder(quote.folder).finished(quote.args or "")
    return f"{runs['time/total_s'].sum() / 3600:.{_dec(quote, 1)}f}"


def _one(q: Quotes, quote: Quote, column: str) -> float:
    """A value every run of the folder shares (the budget, the corpus): an error where they differ."""
    values = q.folder(quote.folder).finished()[column].dropna().unique()
    if len(values) != 1:
        raise ResultsError(f"{quote.text}: the runs differ in {column} ({', '.join(map(str, values))})")
    return float(values[0])


TOKENS_PER_STEP = 16 * 128  # the batch of every committed run, where runs.csv predates tokens_per_step


def _planned(q: Quotes, quote: Quote) -> float:
    """Tokens per run: ``tokens_planned``, or ``param:max_steps`` times the batch in older folders."""
    if "tokens_planned" in q.folder(quote.folder).frame:
        return _one(q, quote, "tokens_planned")
    return _one(q, quote, "param:max_steps") * TOKENS_PER_STEP


def _tokens(q: Quotes, quote: Quote) -> str:
    return f"{_planned(q, quote) / 1e6:.{_dec(quote, 1)}f}M"


def _train_tokens(q: Quotes, quote: Quote) -> str:
    return f"{_one(q, quote, 'data_train_tokens') / 1e6:.{_dec(quote, 1)}f}M"


def _steps(q: Quotes, quote: Quote) -> str:
    if "param:max_steps" in q.folder(quote.folder).frame:
        return f"{_one(q, quote, 'param:max_steps'):.0f}"
    return f"{_planned(q, quote) / _one(q, quote, 'tokens_per_step'):.0f}"


def _passes(q: Quotes, quote: Quote) -> str:
    return f"{_planned(q, quote) / _one(q, quote, 'data_train_tokens'):.{_dec(quote, 2)}f}"


def _per_param(q: Quotes, quote: Quote) -> str:
    """Tokens per non-embedding parameter of the row named (``# params_total``: per parameter)."""
    _, _, (row,) = _rows(q, quote, 1)
    column = quote.metric_and_rows[0] or "params_non_embedding"
    runs = q.folder(quote.folder).finished()
    params = runs[runs["run_id"].isin(row.run_ids)][column].unique()
    return f"{_planned(q, quote) / float(params[0]):.{_dec(quote, 1)}f}"


SHOWN = re.compile(r"«(.*?)»")


def _quote(q: Quotes, quote: Quote) -> str:
    """The text after the colon, checked to be in the file named (relative to the root); where part
    of it is marked ``«...»``, the whole is checked and only that part shown (the rest is context
    that pins the number to its place: ``{{quote F: 9, 8.0 | «+0.0281» [``)."""
    shown = SHOWN.findall(quote.args)
    if len(shown) > 1:
        raise ResultsError(f"{quote.text}: one «...» a quote (a placeholder shows one number)")
    said = SHOWN.sub(r"\1", quote.args)
    if said not in (q.root / quote.folder).read_text():
        raise ResultsError(f"{quote.text}: {quote.folder} no longer says {said!r}")
    return shown[0] if shown else said


def _table(q: Quotes, quote: Quote) -> str:
    """The first Markdown table of a generated file (``decision.md``, ``readouts.md``), whole."""
    lines = (q.root / quote.folder).read_text().splitlines()
    start = next((i for i, line in enumerate(lines) if line.startswith("|")), None)
    if start is None:
        raise ResultsError(f"{quote.text}: no table in {quote.folder}")
    end = next((i for i in range(start, len(lines)) if not lines[i].startswith("|")), len(lines))
    return "\n".join(lines[start:end])


def _depth_answer(q: Quotes, quote: Quote) -> str:
    """The answer a depth study's section opens with (its ``depth.md``: the first line under the
    heading, :func:`results.render.depth.write_depth_study`)."""

    path = q.root / quote.folder / SECTION_FILE
    if not path.is_file():
        raise ResultsError(f"{quote.text}: no {SECTION_FILE} in {quote.folder} (a report of a depth study writes it)")
    lines = path.read_text().splitlines()
    if not lines or lines[0] != SECTION:
        raise ResultsError(f"{quote.text}: {path} does not open with {SECTION!r}")
    return next(line for line in lines[1:] if line.strip())


def _lr_table(q: Quotes, quote: Quote) -> str:
    """The folder's learning-rate table, as its report has it (:func:`results.render.lr.lr_markdown`)."""
    results = q.folder(quote.folder).results
    lines = lr_markdown(lr_curves(results), results.metric_label)
    return "\n".join(lines[2:]).strip()  # without the report's heading


def _ranking_table(q: Quotes, quote: Quote) -> str:
    """Every row of the folder, lowest mean first: PPL (n) and the named row minus it, paired on
    common seeds where it can be (:meth:`Row.compare`), with p and the test."""
    results = q.folder(quote.folder).results
    metric = results.ppl_metric
    against = find_row(results, quote.args)
    lines = [
        f"| row | PPL (n) | {against.label} minus it, 95% CI | p | test |",
        "|---|---:|---:|---:|---|",
    ]
    for row in sorted(results.rows, key=lambda r: r.stats[metric].mean):
        stat = row.stats[metric]
        cells = [row.label, f"{stat.mean:.2f} ± {stat.std or 0.0:.2f} ({stat.n})", "", "", ""]
        comparison = against.compare(row, metric) if row is not against else None
        if comparison is not None:
            cells[2:] = [log_ratio_text(comparison), format_p(comparison.p), comparison.test]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


KINDS: dict[str, Callable[[Quotes, Quote], str]] = {
    "mean": _mean,  # {{mean.1 F: row}} (# METRIC for another metric)
    "sd": _sd,
    "ppl": _ppl,  # mean ± sd
    "ppl_n": _ppl_n,  # mean ± sd (n)
    "n": _n,  # seeds in the row
    "seed": _seed,  # {{seed F: row @ SEED}}
    "ratio": _ratio,  # mean over mean - 1, in %
    "delta": _delta,  # A minus B: paired log-PPL Δ as a ratio with its 95% CI
    "change": _change,  # the same ratio without its CI
    "p": _p,  # that comparison's two-sided p
    "runs": _runs,  # finished runs (: ROW / ROW: of those rows)
    "cpu_hours": _cpu_hours,  # time/total_s summed (: ROW / ROW)
    "tokens": _tokens,  # tokens per run
    "train_tokens": _train_tokens,  # the corpus's training split
    "steps": _steps,
    "passes": _passes,  # passes over the training split
    "per_param": _per_param,  # tokens per (non-embedding) parameter of a row
    "quote": _quote,  # {{quote FILE: text}}: text checked to be in FILE
    "table": _table,  # {{table FILE}}: its first Markdown table
    "lr_table": _lr_table,
    "depth_answer": _depth_answer,  # {{depth_answer F}}: the depth study's answer, from F/depth.md
    "ranking_table": _ranking_table,  # {{ranking_table F: row}}
}


def placeholders(template: str) -> list[Quote]:
    """Every placeholder of ``template``, in order."""
    return [_parse(m) for m in PLACEHOLDER.finditer(template)]


def _parse(match: re.Match[str]) -> Quote:
    decimals = match.group("decimals")
    return Quote(
        match.group("kind"),
        match.group("folder"),
        (match.group("args") or "").strip(),
        int(decimals) if decimals is not None else None,
        match.group(0),
    )


def render(template: str, root: Path, quotes: Quotes | None = None) -> str:
    """``template`` with every placeholder replaced by its value from the folders under ``root``;
    a ``{{`` left that is not a placeholder is an error (a typo would otherwise reach the page)."""
    q = quotes or Quotes(root)
    leftover = PLACEHOLDER.sub("", template)
    if "{{" in leftover:
        bad = leftover[leftover.index("{{") :][:60]
        raise ResultsError(f"not a placeholder: {bad!r} (the form is {{{{KIND[.DECIMALS] FOLDER[: ARGS]}}}})")
    return PLACEHOLDER.sub(lambda m: q.resolve(_parse(m)), template)


def page_for(template: Path) -> Path:
    """``README.template.md`` -> ``README.md``."""
    return template.with_name(template.name.removesuffix(TEMPLATE_SUFFIX) + ".md")


def write_page(template: Path, root: Path | None = None) -> tuple[Path, str]:
    """The page of ``template`` (its numbers from the folders under ``root``, default the template's
    own folder): (its path, its text). Writes nothing."""
    text = HEADER.format(template=template.name) + render(template.read_text(), root or template.parent)
    return page_for(template), text


__all__ = [
    "KINDS",
    "TEMPLATE_SUFFIX",
    "Quote",
    "Quotes",
    "find_row",
    "page_for",
    "placeholders",
    "render",
    "write_page",
]
