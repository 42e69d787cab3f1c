"""``mesh-model``: parameter tables and a forward/backward check, without training.

mesh-model params                 # the paper's rows: non-embedding, router, % of vanilla
mesh-model params --preset tiny --layout 1+2R3+1 --scheme mesh
mesh-model params --preset tiny --moe-experts 8 --moe-top-k 2   # a mixture-of-experts MLP
mesh-model check                  # every scheme forward+backward on the tiny preset
"""

from __future__ import annotations

# torch is imported inside each command: --help answers at once.
import sys
import time
from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING

from mesh_model.cli_text import parser_for
from mesh_model.errors import ConfigError
from mesh_model.scheme_names import PAPER_SCHEMES

if TYPE_CHECKING:
    from mesh_model.config import ModelConfig

# (preset, layout) pairs the paper reports; each gets vanilla, base and +mesh rows.
PAPER_LAYOUTS: tuple[tuple[str, str], ...] = (
    ("pythia-160m", "2+4R2+2"),
    ("pythia-410m", "4+8R2+4"),
    ("pythia-410m", "3+6R3+3"),
    ("pythia-1b", "3+5R2+3"),
    ("pythia-1.4b", "4+8R2+4"),
    ("pythia-1.4b", "4+8+8+4"),
    ("pythia-2.8b", "6+10R2+6"),
    ("pythia-6.9b", "6+10R2+6"),
    ("olmoe-2.6b", "4+8R2+4"),  # the looped OLMoE: mixture-of-experts MLPs
)
# What ``check`` trains: the paper's schemes but vanilla (a layout, not a scheme) and the sum of all
# three terms (its terms are checked alone and in the paper's sums of two).
CHECK_SCHEMES = tuple(s for s in PAPER_SCHEMES if s not in ("vanilla", "residual+anchor+anchor_emb"))
COLUMNS = (
    "preset",
    "layout",
    "scheme",
    "B",
    "non-embedding",
    "router",
    "% of vanilla",
    "GFLOPs/token",
    "experts (E/k)",
    "active non-embedding",
    "total",
    "active total",
)


def parameter_row(config: ModelConfig, seq_len: int | None = None) -> dict[str, str]:
    import torch  # torch only once a command runs: --help answers at once

    from mesh_model.accounting import count_parameters
    from mesh_model.model import build_model

    with torch.device("meta"):
        counts = count_parameters(build_model(config), seq_len)
    return {
        "preset": config.preset or "-",
        "layout": config.layout,
        "scheme": "vanilla" if config.parsed_layout.is_vanilla else config.scheme,
        "B": str(config.slots) if config.slots else "-",
        "non-embedding": f"{counts['non_embedding']:,}",
        "router": f"{counts['router']:,}",
        "% of vanilla": f"{counts['pct_of_vanilla']:.3f}",
        "GFLOPs/token": f"{counts['flops_per_token'] / 1e9:.3f}",
        "experts (E/k)": f"{config.moe.experts}/{config.moe.top_k}" if config.moe else "-",
        "active non-embedding": f"{counts['active_non_embedding']:,}" if config.moe else "-",
        "total": f"{counts['total']:,}",
        "active total": f"{counts['active_total']:,}" if config.moe else "-",
    }


def paper_configs() -> Iterable[ModelConfig]:
    from mesh_model.config import ModelConfig

    seen: set[tuple[str, str]] = set()
    for preset, layout in PAPER_LAYOUTS:
        base = ModelConfig.from_preset(preset, layout=layout)
        vanilla = base.vanilla()
        if (preset, vanilla.layout) not in seen:
            seen.add((preset, vanilla.layout))
            yield vanilla
        if not base.parsed_layout.is_shared:
            yield base.replace(scheme="mesh")
            continue
        yield base
        yield base.replace(scheme="mesh")


def format_table(rows: Sequence[dict[str, str]], columns: Sequence[str] = COLUMNS) -> str:
    widths = {c: max(len(c), *(len(r[c]) for r in rows)) for c in columns}
    lines = ["| " + " | ".join(c.ljust(widths[c]) for c in columns) + " |"]
    lines.append("|" + "|".join("-" * (widths[c] + 2) for c in columns) + "|")
    for row in rows:
        lines.append(
            "| "
            + " | ".join(
                row[c].rjust(widths[c]) if c not in ("preset", "layout", "scheme") else row[c].ljust(widths[c])
                for c in columns
            )
            + " |"
        )
    return "\n".join(lines)


def check_schemes(preset: str = "tiny", layout: str | None = None, steps: int = 3) -> list[dict[str, str]]:
    """Train each scheme a few AdamW steps on one random batch; the loss must fall."""
    import torch

    from mesh_model.config import ModelConfig
    from mesh_model.model import build_model

    rows = []
    for scheme in CHECK_SCHEMES:
        torch.manual_seed(0)
        config = ModelConfig.from_preset(preset, scheme=scheme, **({"layout": layout} if layout else {}))
        model = build_model(config)
        optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
        tokens = torch.randint(0, config.vocab_size, (4, 64))
        start = time.perf_counter()
        losses = []
        for _ in range(steps):
            out = model(tokens, labels=tokens)
            loss = out.loss if out.aux_loss is None else out.loss + out.aux_loss
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            losses.append(loss.item())
        rows.append(
            {
                "scheme": scheme,
                "layout": config.layout,
                "loss first": f"{losses[0]:.4f}",
                "loss last": f"{losses[-1]:.4f}",
                "ms/step": f"{1000 * (time.perf_counter() - start) / steps:.1f}",
            }
        )
    return rows


def main(argv: Sequence[str] | None = None) -> int:
    parser = parser_for("mesh-model", __doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    params = sub.add_parser("params", help="print the parameter table")
    params.add_argument("--preset", help="one preset instead of the paper's rows")
    params.add_argument("--layout")
    params.add_argument("--scheme", default=None)
    params.add_argument("--buffer-slots", type=int, default=None)
    params.add_argument("--seq-len", type=int, default=None, help="sequence length for FLOPs/token")
    params.add_argument("--moe-experts", type=int, default=None, help="experts per MoE MLP (E); unset: dense")
    params.add_argument("--moe-top-k", type=int, default=None, help="experts per token (k)")
    params.add_argument("--moe-hidden", type=int, default=None, help="width of each expert")
    check = sub.add_parser("check", help="forward+backward of every scheme on a small preset")
    check.add_argument("--preset", default="tiny")
    check.add_argument("--layout", default=None)
    args = parser.parse_args(argv)
    from mesh_model.config import ModelConfig

    try:
        if args.command == "params":
            if args.preset:
                given = {
                    "layout": args.layout,
                    "scheme": args.scheme,
                    "buffer_slots": args.buffer_slots,
                    "moe_experts": args.moe_experts,
                    "moe_top_k": args.moe_top_k,
                    "moe_hidden": args.moe_hidden,
                }
                overrides = {k: v for k, v in given.items() if v is not None}
                config = ModelConfig.from_preset(args.preset, **overrides)
                configs = [config.vanilla(), config] if not config.parsed_layout.is_vanilla else [config]
            else:
                configs = list(paper_configs())
            print(format_table([parameter_row(c, args.seq_len) for c in configs]))
        else:
            rows = check_schemes(args.preset, args.layout)
            print(format_table(rows, tuple(rows[0])))
    except ConfigError as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
