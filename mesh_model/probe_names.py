"""Names and orders of what the probes log, for tables and figures alike (nothing drawn here, no torch).

One colour per scheme in every figure of the project (:func:`scheme_color`: the probe figures of
:mod:`experiments.probing.figures`, the report's figures, MLflow's run colours). The k-th row of one
scheme is told apart by :func:`variant_index`. A vanilla layout is shown as one stack,
``stack`` (:func:`shown_blocks`, :func:`shown_stages`): the probes log its update and state as
``prelude`` (all its layers) beside a ``coda`` of 0 layers (update 0, the same state again), which
it does not have and tables and figures leave out. Blocks sort as the forward pass runs them
(:func:`block_order`).

A mixture-of-experts run's router calls are named as the probes log them (:func:`router_calls`)
and sorted in the order they run (:func:`call_order`).
"""

from __future__ import annotations

import contextlib
import hashlib
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

from mesh_model.errors import ConfigError
from mesh_model.scheme_names import PAPER_SCHEMES, SchemeSpec

if TYPE_CHECKING:
    from mesh_model.probes import ProbeReport

# scheme -> colour (the tab10/tab20 palette's hues): every scheme the paper reports, in its order.
# Other names get one of FALLBACK_COLORS by a hash of the name (the same in every process).
SCHEME_COLORS = dict(
    zip(
        PAPER_SCHEMES,
        (
            "#7f7f7f",  # vanilla
            "#1f77b4",  # base
            "#ff7f0e",  # residual
            "#17becf",  # anchor_emb
            "#2ca02c",  # anchor
            "#bcbd22",  # residual+anchor
            "#ffbb78",  # residual+anchor+anchor_emb
            "#98df8a",  # anchor+anchor_emb
            "#9467bd",  # static
            "#e377c2",  # dynamic
            "#d62728",  # mesh
        ),
        strict=True,
    )
)
FALLBACK_COLORS = ("#8c564b", "#aec7e8", "#c5b0d5", "#c49c94", "#f7b6d2", "#dbdb8d", "#9edae5", "#ff9896")


def scheme_color(scheme: str) -> str:
    """The colour of ``scheme`` in every figure: fixed for the names in :data:`SCHEME_COLORS` (and
    their aliases, e.g. ``anchor*``), else chosen by a hash of the canonical name."""
    name = scheme.strip().lower()
    if name not in SCHEME_COLORS:
        with contextlib.suppress(ConfigError):
            name = SchemeSpec.parse(name).canonical
    if name in SCHEME_COLORS:
        return SCHEME_COLORS[name]
    digest = hashlib.sha256(name.encode()).digest()
    return FALLBACK_COLORS[int.from_bytes(digest[:4], "big") % len(FALLBACK_COLORS)]


def scheme_of(label: str) -> str:
    """The scheme of a row label (``mesh 4+8R2+4 B5`` -> ``mesh``): its first word."""
    return label.split()[0] if label.strip() else label


def variant_index(schemes: Iterable[str]) -> list[int]:
    """For each scheme in order, how many times it came before: the k-th row of a scheme is drawn
    in its colour with the k-th marker, line style or hatch."""
    seen: dict[str, int] = {}
    out = []
    for scheme in schemes:
        out.append(seen.get(scheme, 0))
        seen[scheme] = out[-1] + 1
    return out


# ---------------------------------------------------------------- blocks and stages

VANILLA_STACK = "stack"


def shown_blocks(blocks: Iterable[str], vanilla: bool) -> dict[str, str]:
    """The update blocks a reader sees -> the block name the probes logged. A vanilla layout has one
    stack, logged as ``prelude`` (embedding -> all its layers; its ``coda`` has 0 layers): shown as
    :data:`VANILLA_STACK`, nothing else. A looped layout's blocks are shown as logged."""
    blocks = list(blocks)
    if vanilla:
        return {VANILLA_STACK: "prelude"} if "prelude" in blocks else {}
    return {block: block for block in blocks}


def block_order(name: str) -> tuple[int, int, str]:
    """stack, prelude, core1..coreK, coda, then anything else by name."""
    if name.startswith("core") and name[4:].isdigit():
        return (2, int(name[4:]), "")
    rank = {VANILLA_STACK: 0, "prelude": 1, "coda": 3}
    return (rank.get(name, 4), 0, name)


def is_vanilla(report: ProbeReport) -> bool:
    """Whether ``report`` is of a vanilla layout: no loop, no core block."""
    return report.loops is None and not any(b.startswith("core") for b in report.updates)


def shown_updates(report: ProbeReport, kind: str) -> dict[str, tuple[float, float]]:
    """The (mean, std) of the update measure ``kind`` ('updates' or 'state_updates') of each block a
    reader sees (:func:`shown_blocks`)."""
    updates = getattr(report, kind)
    return {shown: updates[logged] for shown, logged in shown_blocks(updates, is_vanilla(report)).items()}


def shown_stages(report: ProbeReport) -> dict[str, int]:
    """The stages of the CKA and spectra figures -> their index in ``report.stages``. A vanilla
    layout's ``prelude`` is its whole stack (shown as :data:`VANILLA_STACK`) and its ``coda`` (0
    layers) the same tensor again: not shown."""
    if not is_vanilla(report) or "prelude" not in report.stages:
        return {stage: i for i, stage in enumerate(report.stages)}
    return {
        (VANILLA_STACK if stage == "prelude" else stage): i for i, stage in enumerate(report.stages) if stage != "coda"
    }


def shown_matrix(report: ProbeReport, estimator: str) -> Any:
    """``estimator``'s CKA matrix over the stages a reader sees (:func:`shown_stages`)."""
    index = list(shown_stages(report).values())
    return report.cka_matrices[estimator][index][:, index]


# ---------------------------------------------------------------- mixture-of-experts routing

CORE_PREFIX = "cores."


def router_calls(block: str, calls: int) -> list[str]:
    """How the ``calls`` router calls of the MoE block ``block`` (its module name, ``prelude.0``,
    ``cores.0.1``, ``coda.0``) are named in metrics and figures: ``<block>/iter<t>`` (t = 1..) for a
    core block, whose router runs once per loop iteration, ``<block>`` for a block called once."""
    if block.startswith(CORE_PREFIX) or calls > 1:
        return [f"{block}/iter{t}" for t in range(1, calls + 1)]
    return [block]


def call_order(name: str) -> tuple[int, int, int, int, str]:
    """Sort key of a router call (:func:`router_calls`) in the order the calls run: the prelude's
    blocks, then the cores iteration by iteration (core stack, iteration, layer), then the coda's."""
    block, _, rest = name.partition("/")
    iteration = rest.split("/")[0]  # a Jaccard pair <block>/iter<t>/iter<t+1> sorts by its first call
    t = int(iteration[4:]) if iteration.startswith("iter") and iteration[4:].isdigit() else 1
    stage, *rest = block.split(".")
    numbers = [int(part) for part in rest if part.isdigit()]
    if stage == "cores" and len(numbers) == 2:
        return (1, numbers[0], t, numbers[1], "")
    return ({"prelude": 0, "coda": 2}.get(stage, 3), 0, t, numbers[-1] if numbers else 0, block)


__all__ = [
    "CORE_PREFIX",
    "FALLBACK_COLORS",
    "SCHEME_COLORS",
    "VANILLA_STACK",
    "block_order",
    "call_order",
    "is_vanilla",
    "router_calls",
    "scheme_color",
    "scheme_of",
    "shown_blocks",
    "shown_matrix",
    "shown_stages",
    "shown_updates",
    "variant_index",
]
