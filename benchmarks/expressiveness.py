"""How close MeSH's routing can come to each fixed scheme's effective coefficients
(mesh_model/expressiveness.py): the squared Frobenius error of the closest routing, for base,
residual, anchor and anchor* at K = 2, 3 and B = 3..6, with the paper's final read and with the
residual final read (``mesh_final_read=residual``).

    .venv/bin/python benchmarks/expressiveness.py            # ~3 min on one busy core
    .venv/bin/python benchmarks/expressiveness.py --starts 64 --seed 1

No model, no data: the numbers are properties of softmax reads over B slots and additive writes.
"""

from __future__ import annotations

import argparse
import sys

import torch

from mesh_model.expressiveness import SCHEMES, STARTS, describe, fit_table, table_markdown


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--starts", type=int, default=STARTS, help="random starts per fit")
    parser.add_argument("--seed", type=int, default=49, help="the starts' seed")
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    command = " ".join(["python benchmarks/expressiveness.py", *(argv if argv is not None else sys.argv[1:])])
    print(f"`{command}` (starts {args.starts}, seed {args.seed})\n")
    closest = {}
    for final_read in ("read", "residual"):
        rows = fit_table(SCHEMES, (2, 3), (3, 4, 5, 6), final_read, args.starts, args.seed)
        print(f"final read: {final_read} — squared Frobenius error of the closest MeSH routing\n")
        print(table_markdown(rows) + "\n")
        closest[final_read] = next(r for r in rows if (r.scheme, r.loops, r.slots) == ("anchor", 2, 5))
    for final_read, row in closest.items():
        print(f"anchor, K = 2, B = 5, final read {final_read}: closest coefficients (target in brackets)\n")
        print("```\n" + describe(row.fit) + "\n```\n")


if __name__ == "__main__":
    main()
