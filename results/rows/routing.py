"""How each row passes state along the loop, from the ``routing/*`` metrics every looped run logs at
each validation (experiments/probing/state_routing.py): ``routing.csv``, the figures and the
report's routing section and appendix table. Descriptive: no claim is tested here.

* ``routing.csv``: every logged step of every run for the coda input's coefficients
  (``routing/coef/coda/<source>/mean``) and MeSH's router entropies (``routing/<router>/<kind>/entropy``).
* ``routing_coefficients``: the coda input's coefficient of f_K over tokens, every row's mean over
  seeds in its scheme's colour; a fixed scheme is a flat line (base 1), so every scheme sits in it.
* ``routing_<row>``, one per MeSH row: each source's coefficient in the coda input over tokens, one
  line per seed coloured by the run's final validation PPL, and the entropy of the transitional and
  the final read.
"""

from __future__ import annotations

from results.rows.aggregate import Results, Row

FILE = "routing.csv"


PREFIX = "routing/"


COLUMNS = ("run_id", "row", "scheme", "seed", "step", "tokens", "metric", "value")


def coda_sources(row: Row) -> list[str]:
    """The sources of the coda input a row logged, in order: h_emb, prelude, f1 .. fK."""
    sources = [m.split("/")[3] for m in row.stats if m.startswith("routing/coef/coda/") and m.endswith("/mean")]
    order = {"h_emb": -2, "prelude": -1}
    return sorted(sources, key=lambda s: order.get(s, int(s[1:]) if s[1:].isdigit() else 99))


def last_core(row: Row) -> str | None:
    """``f<K>``, the last core output, when the row logged its coefficients."""
    cores = [s for s in coda_sources(row) if s.startswith("f")]
    return cores[-1] if cores else None


def routed_rows(results: Results) -> list[Row]:
    """Rows whose runs logged the routing metrics."""
    return [row for row in results.rows if any(m.startswith(PREFIX) for m in row.stats)]


def is_mesh(row: Row) -> bool:
    return any(m.startswith("routing/transition/") for m in row.stats)


def curve_keys(row: Row) -> list[str]:
    keys = [f"routing/coef/coda/{s}/mean" for s in coda_sources(row)]
    return keys + sorted(m for m in row.stats if m.startswith("routing/") and m.endswith("/entropy"))
