"""The layers contract (pyproject.toml: results -> sweeps -> experiments -> mesh_model) holds on
the tree, and breaks when a lower layer imports a higher one."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
LINT_IMPORTS = str(Path(sys.executable).parent / "lint-imports")
PACKAGES = ("mesh_model", "experiments", "sweeps", "results")
CONTRACTS = (ROOT / "pyproject.toml").read_text().count("[[tool.importlinter.contracts]]")


def lint_imports(root: Path) -> subprocess.CompletedProcess:
    return subprocess.run(
        [LINT_IMPORTS, "--config", str(root / "pyproject.toml"), "--no-cache"],
        cwd=root,
        env={"PATH": "/usr/bin:/bin", "PYTHONPATH": str(root)},
        capture_output=True,
        text=True,
        timeout=120,
    )


def copy_tree(target: Path) -> Path:
    shutil.copy(ROOT / "pyproject.toml", target / "pyproject.toml")
    for package in PACKAGES:
        shutil.copytree(ROOT / package, target / package, ignore=shutil.ignore_patterns("__pycache__", "*.yaml"))
    return target


def test_the_tree_keeps_the_layers_contract(tmp_path):
    result = lint_imports(copy_tree(tmp_path))
    assert result.returncode == 0, result.stdout + result.stderr
    assert CONTRACTS >= 3  # the packages' layers, and the rooms inside sweeps/ and sweeps/launch/
    assert f"{CONTRACTS} kept, 0 broken" in result.stdout


@pytest.mark.parametrize(
    ("module", "back_import"),
    [
        ("experiments/plan.py", "import sweeps.grid  # noqa"),
        ("mesh_model/layout.py", "from experiments import identity  # noqa"),
        ("sweeps/cells.py", "def _late():\n    import results.runs.store  # noqa\n"),  # a lazy import counts too
    ],
)
def test_a_back_import_breaks_the_contract(tmp_path, module, back_import):
    root = copy_tree(tmp_path)
    with (root / module).open("a") as file:
        file.write(f"\n{back_import}\n")
    result = lint_imports(root)
    assert result.returncode == 1, result.stdout
    assert "results -> sweeps -> experiments -> mesh_model BROKEN" in result.stdout, result.stdout
    assert f"{CONTRACTS} kept, 0 broken" not in result.stdout  # a cycle through sweeps breaks its rooms too
