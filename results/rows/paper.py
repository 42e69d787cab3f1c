"""The paper's numbers (``results/paper_numbers.csv``), read at run time, and matching them to our rows.

Each line of the data file is one row of a table of the paper: the preset of the same shape, the
scheme (canonical name, or ``vanilla``), the layout, MeSH's B where the table states it, and the
numbers it reports (eval loss, Pile PPL, 0-shot and 5-shot averages in %). ``source`` names the
sweep that reproduces that table: when several tables give a number for the same row, the one of
the sweep being reported wins, then the first line of the file (the headline table).
"""

from __future__ import annotations

import csv
import math
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path

from experiments.identity import canonical_variant
from mesh_model import ConfigError, Layout

DATA_FILE = "paper_numbers.csv"
PAPER_METRICS = ("loss", "ppl", "0shot", "5shot")  # the columns of the data file that hold numbers


@dataclass(frozen=True)
class PaperValue:
    value: float
    text: str  # as printed in the paper (its digits)
    table: str  # which table of the paper
    note: str = ""


@dataclass(frozen=True)
class PaperRow:
    source: str
    table: str
    preset: str
    scheme: str
    layout: str
    buffer_slots: int | None
    values: dict[str, PaperValue] = field(default_factory=dict)


def canonical_scheme(name: str) -> str:
    """:func:`~experiments.identity.canonical_variant`, but an unparsable name passes through."""
    try:
        return canonical_variant(name)
    except ConfigError:
        return name


def canonical_layout(text: str) -> str:
    try:
        return Layout.parse(text).text
    except ConfigError:
        return text


def default_slots(layout: str) -> int | None:
    """MeSH's default B = K + 3 for a layout, or None when it has no loop."""
    try:
        parsed = Layout.parse(layout)
    except ConfigError:
        return None
    return parsed.loops + 3 if parsed.loops else None


def load_paper_numbers(path: str | Path | None = None) -> list[PaperRow]:
    """The rows of the data file (the packaged one unless ``path``), in file order."""
    source = resources.files("results").joinpath(DATA_FILE) if path is None else Path(path)
    text = source.read_text()
    rows = []
    for line in csv.DictReader(text.splitlines()):
        values = {
            metric: PaperValue(float(line[metric]), line[metric].strip(), line["table"], line.get("note") or "")
            for metric in PAPER_METRICS
            if (line.get(metric) or "").strip()
        }
        slots = (line.get("buffer_slots") or "").strip()
        rows.append(
            PaperRow(
                source=line["source"].strip(),
                table=line["table"].strip(),
                preset=line["preset"].strip(),
                scheme=canonical_scheme(line["scheme"].strip()),
                layout=canonical_layout(line["layout"].strip()),
                buffer_slots=int(slots) if slots else None,
                values=values,
            )
        )
    return rows


def slots_value(value: str | int | float | None) -> int | None:
    """B as an integer (from a tag, a CSV cell or a number); None when empty or not a number."""
    if value is None or value == "" or (isinstance(value, float) and math.isnan(value)):
        return None
    try:
        return int(float(value))
    except ValueError:
        return None


def matches(row: PaperRow, preset: str, scheme: str, layout: str, buffer_slots: str | int | None) -> bool:
    """Same preset, scheme and layout; a paper row without B matches MeSH at the default B = K + 3."""
    if (row.preset, row.scheme, row.layout) != (preset, canonical_scheme(scheme), canonical_layout(layout)):
        return False
    ours = slots_value(buffer_slots)
    if row.buffer_slots is None:
        return ours is None or ours == default_slots(layout)
    return ours == row.buffer_slots


def paper_values(
    rows: list[PaperRow],
    preset: str,
    scheme: str,
    layout: str,
    buffer_slots: str | int | None,
    prefer: tuple[str, ...] = (),
) -> dict[str, PaperValue]:
    """metric -> the paper's number for our row (empty when the paper has no such row). Sources in
    ``prefer`` (the sweeps being reported) come first, then file order."""
    found = [r for r in rows if matches(r, preset, scheme, layout, buffer_slots)]
    found.sort(key=lambda r: 0 if r.source in prefer else 1)  # stable: file order within each
    values: dict[str, PaperValue] = {}
    for row in found:
        for metric, value in row.values.items():
            values.setdefault(metric, value)
    return values


__all__ = ["PAPER_METRICS", "PaperRow", "PaperValue", "load_paper_numbers", "matches", "paper_values", "slots_value"]
