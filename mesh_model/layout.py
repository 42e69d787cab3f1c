"""Prelude-Recurrent-Coda layouts: parsing `24`, `4+8R2+4` and `4+8+8+4`.

A layout says which distinct layer stacks exist and in which order they run:

* ``N``            vanilla: N layers, no recurrence (no state passing applies).
* ``P+CRK+Q``      a prelude of P layers, one core of C layers applied K times with shared
                   weights, a coda of Q layers (P or Q may be 0; ``CRK`` alone means ``0+CRK+0``).
* ``P+C1+...+Cn+Q`` a prelude, n >= 1 distinct core segments applied once each (no sharing), a
                   coda. State passing (MeSH included) acts at the segment boundaries exactly as
                   it acts between loop iterations, with K = n.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from mesh_model.errors import ConfigError

LAYOUT_FORMS = "use N (vanilla), P+CRK+Q (shared core looped K>=1 times, e.g. 4+8R2+4) or P+C1+...+Cn+Q (distinct segments, e.g. 4+8+8+4)"
# No count in a layout (layers of a part, loops) may exceed this; far beyond any model that fits
# in memory, and it keeps a typo such as 4+8R2000000000+4 from allocating its schedule.
MAX_COUNT = 10_000

_LOOP = re.compile(r"^([0-9]+)R([0-9]+)$")


def _is_number(part: str) -> bool:
    """ASCII digits only: ``str.isdigit`` and ``int`` also take other scripts' digits ('２')."""
    return part.isascii() and part.isdigit()


@dataclass(frozen=True)
class Layout:
    """A parsed layout. ``core_schedule[t]`` is the index of the core stack run at step t."""

    text: str
    prelude: int
    cores: tuple[int, ...]
    core_schedule: tuple[int, ...]
    coda: int

    @property
    def is_vanilla(self) -> bool:
        return not self.cores

    @property
    def is_shared(self) -> bool:
        """True when one core's weights run more than once (a looped layout)."""
        return len(self.core_schedule) > len(self.cores)

    @property
    def loops(self) -> int:
        """K: the number of core applications (loop iterations or distinct segments)."""
        return len(self.core_schedule)

    @property
    def compute_depth(self) -> int:
        """Layers in the unrolled graph; the depth of the compute-matched vanilla model."""
        return self.prelude + sum(self.cores[i] for i in self.core_schedule) + self.coda

    @property
    def distinct_layers(self) -> int:
        """Layers that own parameters."""
        return self.prelude + sum(self.cores) + self.coda

    @classmethod
    def parse(cls, given: str | int) -> Layout:
        text = str(given)  # a depth may come as a number (layout=6 from YAML)
        compact = text.replace(" ", "")
        parts = compact.split("+")
        if not compact or any(p == "" for p in parts):
            raise ConfigError("layout", text, LAYOUT_FORMS)
        if not compact.isascii():
            raise ConfigError("layout", text, "only ASCII digits 0-9, '+' and 'R' are allowed; " + LAYOUT_FORMS)
        looped = [p for p in parts if "R" in p.upper()]
        if looped:
            return cls._parse_looped(text, [p.upper() for p in parts])
        if not all(_is_number(p) for p in parts):
            raise ConfigError("layout", text, LAYOUT_FORMS)
        sizes = [int(p) for p in parts]
        _check_counts(text, sizes)
        if len(sizes) == 1:
            if sizes[0] < 1:
                raise ConfigError("layout", text, "a vanilla layout needs at least 1 layer; " + LAYOUT_FORMS)
            return cls(text=compact, prelude=sizes[0], cores=(), core_schedule=(), coda=0)
        if len(sizes) == 2:
            raise ConfigError("layout", text, "two numbers name no core; " + LAYOUT_FORMS)
        prelude, *cores, coda = sizes
        if any(c < 1 for c in cores):
            raise ConfigError("layout", text, "every core segment needs at least 1 layer; " + LAYOUT_FORMS)
        return cls(
            text=compact,
            prelude=prelude,
            cores=tuple(cores),
            core_schedule=tuple(range(len(cores))),
            coda=coda,
        )

    @classmethod
    def _parse_looped(cls, text: str, parts: list[str]) -> Layout:
        if len(parts) == 1:
            parts = ["0", parts[0], "0"]
        if len(parts) != 3 or not _is_number(parts[0]) or not _is_number(parts[2]):
            raise ConfigError("layout", text, LAYOUT_FORMS)
        match = _LOOP.match(parts[1])
        if match is None:
            raise ConfigError("layout", text, LAYOUT_FORMS)
        core, loops = int(match.group(1)), int(match.group(2))
        _check_counts(text, [int(parts[0]), core, loops, int(parts[2])])
        if core < 1:
            raise ConfigError("layout", text, "the core needs at least 1 layer (C>=1 in P+CRK+Q)")
        if loops < 1:
            raise ConfigError("layout", text, "the loop count must be at least 1 (K>=1 in P+CRK+Q, e.g. 4+8R2+4)")
        return cls(
            text=f"{int(parts[0])}+{core}R{loops}+{int(parts[2])}",
            prelude=int(parts[0]),
            cores=(core,),
            core_schedule=(0,) * loops,
            coda=int(parts[2]),
        )


def _check_counts(text: str, counts: list[int]) -> None:
    if max(counts) > MAX_COUNT:
        raise ConfigError("layout", text, f"every layer and loop count must be at most {MAX_COUNT}; " + LAYOUT_FORMS)
