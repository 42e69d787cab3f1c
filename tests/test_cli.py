import subprocess
import sys

from mesh_model.__main__ import main


def test_params_table_prints_the_paper_rows(capsys):
    assert main(["params"]) == 0
    out = capsys.readouterr().out
    rows = {tuple(c.strip() for c in line.strip("|").split("|")[:4]): line for line in out.splitlines()}
    assert "1,208,602,624" in rows[("pythia-1.4b", "24", "vanilla", "-")]
    base = rows[("pythia-1.4b", "4+8R2+4", "base", "-")]
    assert "805,736,448" in base and "66.667" in base
    mesh = rows[("pythia-1.4b", "4+8R2+4", "mesh", "5")]
    assert "805,797,918" in mesh and "61,470" in mesh
    assert ("pythia-410m", "3+6R3+3", "mesh", "6") in rows


def test_params_for_one_config_and_bad_input(capsys):
    assert main(["params", "--preset", "tiny", "--layout", "1+2R3+1", "--scheme", "mesh"]) == 0
    out = capsys.readouterr().out
    assert "| tiny   | 8       | vanilla |" in out and "| tiny   | 1+2R3+1 | mesh    | 6 |" in out
    assert main(["params", "--preset", "tiny", "--layout", "4+8R0+4"]) == 2
    err = capsys.readouterr().err.strip()
    assert (
        err == "error: layout='4+8R0+4' is invalid: the loop count must be at least 1 (K>=1 in P+CRK+Q, e.g. 4+8R2+4)"
    )


def test_check_trains_every_scheme_and_the_loss_falls():
    result = subprocess.run([sys.executable, "-m", "mesh_model", "check"], capture_output=True, text=True, check=True)
    lines = [line for line in result.stdout.splitlines() if line.startswith("| ") and "scheme" not in line]
    assert len(lines) == 9
    for line in lines:
        cells = [c.strip() for c in line.strip("|").split("|")]
        assert float(cells[3]) < float(cells[2]), line
