"""Bad input stops before compute: one line on stderr, exit code 2, no MLflow run, no data prepared.

Every case runs the console script's ``main`` (``mesh-train``, ``mesh-eval``, ``mesh-probe``) in
this process (tests/helpers.py; a real process where a read-only mount or a full disk is met, or
where what a fresh process imports is the point) with its own
``runs_dir`` and an empty ``MESH_CACHE_DIR``. Afterwards: the one line
names the field, the exit code is 2, the store holds no run (or does not exist), no run folder
exists under ``runs_dir/<experiment>``, the token cache was never touched (no data preparation):
what shows that nothing was computed, where a bound on the time taken would fail on a loaded
machine (a refusal has taken 32 s there). Cases that start servers are marked slow.
"""

from __future__ import annotations

import contextlib
import http.server
import os
import shutil
import sqlite3
import subprocess
import sys
import threading
import urllib.request
from pathlib import Path

import pytest
import torch
from helpers import Ran, run_process, run_tool
from omegaconf import OmegaConf

from experiments.compose import compose_config
from experiments.data.corpora import check_text_files
from experiments.identity import config_hash
from experiments.plan import InputError, check_memory, plan_run
from experiments.store.check import check_runs_dir, check_tracking_uri
from experiments.store.sqlite import TrackingError
from mesh_model import ConfigError, ModelConfig, build_model, count_parameters
from mesh_model.accounting import estimate_step_memory, parameter_count

FAST = ("model=tiny", "max_steps=2", "data.seq_len=32", "data.batch_size=2", "data.val_batches=1")


def tool_env(tmp: Path) -> dict[str, str]:
    """The environment less MLflow's settings, with an empty cache of its own."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("MLFLOW_")}
    env["MESH_CACHE_DIR"] = str(tmp / "cache")
    return env


def cli(tool: str, *args: str, tmp: Path) -> Ran:
    return run_tool(tool, *args, env=tool_env(tmp), cwd=tmp)


def runs_in(db: Path) -> int:
    if not db.exists():
        return 0
    with sqlite3.connect(db) as connection:
        tables = {row[0] for row in connection.execute("select name from sqlite_master where type='table'")}
        return connection.execute("select count(*) from runs").fetchone()[0] if "runs" in tables else 0


def assert_refused(done: Ran, field: str, tmp: Path, runs_dir: Path) -> str:
    """One line, exit 2, and nothing computed: no run, no run folder, nothing fetched or cached
    (what shows that no compute happened; a wall-clock bound would fail on a loaded machine)."""
    lines = [line for line in done.stderr.splitlines() if line.strip()]
    assert len(lines) == 1, done.stderr
    assert done.returncode == 2, done.stderr
    line = lines[0]
    assert line.startswith("error: ") and field in line, line
    assert runs_in(runs_dir / "mlflow.db") == 0
    assert not (runs_dir / "mesh").exists()  # no run folder (and no MLflow experiment folder)
    assert not (tmp / "cache").exists()  # nothing was fetched, tokenized or cached
    return line


def binary_file(tmp: Path) -> Path:
    path = tmp / "weights.bin"
    path.write_bytes(bytes(range(256)) * 64)
    return path


@pytest.mark.parametrize(
    ("overrides", "field"),
    [
        (["optim.lr=-1"], "optim.lr=-1.0 is invalid"),
        (["optim.lr=nan"], "optim.lr=nan is invalid"),
        (["seed=-1"], "seed=-1 is invalid"),
        (["scheme=1e400*anchor"], "scheme='1e400*anchor' is invalid: the coefficient of anchor (1e400)"),
        (["scheme=anchor]"], "override 'scheme=anchor]' is malformed"),
        (["layout=1+2R２+1"], "override 'layout=1+2R２+1' is malformed"),
        (["layout='1+2R２+1'"], "layout='1+2R２+1' is invalid: only ASCII digits"),
        (["data.seq_len=abc"], "data.seq_len='abc' is invalid: must be an integer"),
        (["scheme=anchor", "buffer_slots=5"], "buffer_slots=5 is invalid: only scheme=mesh has a buffer"),
        (["scheme=vanilla", "buffer_slots=5"], "buffer_slots=5 is invalid"),
        (["tracking.tracking_uri=postgresql://nowhere/db"], "tracking_uri='postgresql://nowhere/db'"),
        (["tracking.tracking_uri=sqlite:///{tmp}/notadb.db"], "is not a SQLite database"),
        (["runs_dir={tmp}/afile"], "runs_dir="),
        (["data=text", "data.path={tmp}/weights.bin"], "data.path="),
        (["data=indexed", "data.path={tmp}/nope"], "nope.bin and nope.idx not found; give the prefix of a Megatron"),
        (["data=indexed", "data.path={tmp}/weights"], "weights.idx not found"),
        (["data=indexed", "data.path={tmp}/notadb"], "notadb.idx is not a Megatron MMapIndexedDataset index"),
        (["layout=1+2R1000+1", "scheme=mesh"], "layout=1+2R1000+1: the training step needs about"),
    ],
)
def test_mesh_train_refuses_bad_input_before_compute(tmp_path, overrides, field):
    binary_file(tmp_path)
    (tmp_path / "afile").write_text("not a folder")
    (tmp_path / "notadb.db").write_text("plain text, not a database")
    for suffix in ("bin", "idx"):  # a .bin/.idx pair that is not an indexed dataset
        (tmp_path / f"notadb.{suffix}").write_text("plain text")
    runs_dir = tmp_path / "runs"
    args = [o.format(tmp=tmp_path) for o in overrides]
    if not any(a.startswith("runs_dir=") for a in args):
        args.append(f"runs_dir={runs_dir}")
    done = cli("mesh-train", *FAST, *args, tmp=tmp_path)
    line = assert_refused(done, field, tmp_path, runs_dir)
    if "postgresql" in field:
        assert "driver" in line or "does not answer" in line
    if "1+2R1000+1" in field:
        assert "MeSH coefficients" in line and "allow_large=true" in line


@pytest.mark.parametrize("name", ["../../escaped", "{tmp}/escaped", "a/../../escaped", "."])
def test_an_experiment_name_that_would_leave_runs_dir_is_refused_in_one_line(tmp_path, name):
    """Before: the run folder and MLflow's artifacts were written at runs_dir/../../escaped."""
    runs_dir = tmp_path / "deep" / "runs"
    experiment = name.format(tmp=tmp_path)
    done = cli("mesh-train", *FAST, f"runs_dir={runs_dir}", f"tracking.experiment={experiment}", tmp=tmp_path)
    line = assert_refused(
        done, f"tracking.experiment={experiment!r} is invalid: it names the folder", tmp_path, runs_dir
    )
    assert "runs_dir" in line
    assert not (tmp_path / "escaped").exists() and not (tmp_path / "deep" / "escaped").exists()


def test_a_refusal_does_not_import_lightning(tmp_path):
    """A fresh process refused on a bad value has loaded neither Lightning nor MLflow: the refusal
    costs the config's checks, not the training stack's imports."""
    script = (
        "import sys\n"
        "from experiments.train import cli\n"
        "try:\n"
        f"    cli(['optim.lr=-1', 'runs_dir={tmp_path / 'runs'}'])\n"
        "except SystemExit as stop:\n"
        "    print(stop.code, sorted(m for m in ('lightning', 'mlflow') if m in sys.modules))\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, env=tool_env(tmp_path), cwd=tmp_path
    )
    assert done.stderr.startswith("error: optim.lr=-1.0 is invalid"), done.stderr
    assert done.stdout == "2 []\n"


def test_check_path_false_leaves_data_path_to_the_job_and_keeps_the_run_identity(tmp_path):
    """Data staged to a node's local disk exists only where the job runs: ``data.check_path=false``
    plans the run without looking, and is not part of what the run is (its hash)."""
    missing = ["data=indexed", f"data.path={tmp_path}/only-on-the-node", f"runs_dir={tmp_path}"]
    with pytest.raises(ConfigError, match="only-on-the-node.bin and only-on-the-node.idx not found"):
        plan_run(compose_config(["model=tiny", *missing]))
    unchecked = compose_config(["model=tiny", *missing, "data.check_path=false"])
    plan = plan_run(unchecked.copy())
    checked = compose_config(["model=tiny", *missing])
    assert config_hash(unchecked, plan.model_config) == config_hash(checked, plan.model_config)
    assert unchecked.data.check_path is False and checked.data.check_path is True


@pytest.mark.parametrize(
    ("backend", "field"),
    [
        ("foo", "MESH_LOSS_BACKEND='foo' is invalid"),
        ("liger", "MESH_LOSS_BACKEND='liger' is invalid: liger runs on CUDA"),
    ],
)
def test_a_bad_loss_backend_is_refused_before_compute(tmp_path, backend, field, monkeypatch):
    monkeypatch.setenv("MESH_LOSS_BACKEND", backend)
    runs_dir = tmp_path / "runs"
    done = cli("mesh-train", *FAST, f"runs_dir={runs_dir}", tmp=tmp_path)
    assert_refused(done, field, tmp_path, runs_dir)


def test_the_data_file_named_in_the_line_is_the_binary_one(tmp_path):
    folder = tmp_path / "corpus"
    folder.mkdir()
    (folder / "a.txt").write_text("To be, or not to be, that is the question.\n" * 40)
    (folder / "b.txt").write_bytes("Ceci est écrit en Latin-1, à éviter. ".encode("latin-1") * 40)
    with pytest.raises(ConfigError, match=r"'b.txt' is not UTF-8 text \(\d+ of the first \d+ characters"):
        check_text_files(str(folder))
    (folder / "b.txt").write_bytes(binary_file(tmp_path).read_bytes())
    with pytest.raises(ConfigError, match=r"'b.txt' has NUL bytes in its first KB"):
        check_text_files(str(folder))
    # UTF-8 text with a stray byte or two (below 1% of the first KB) is text
    (folder / "b.txt").write_bytes((b"plain text, " * 30 + b"\xff\n") * 10)
    check_text_files(str(folder))


def read_only_prefix(folder: Path) -> tuple[str, ...]:
    """A command prefix under which ``folder`` is read-only: a read-only bind mount in a private
    mount namespace as root (root writes through permission bits), else the permission bits."""
    if os.geteuid() != 0:
        folder.chmod(0o555)
        return ()
    probe = subprocess.run(
        ["unshare", "-m", "sh", "-c", f"mount --bind {folder} {folder} && mount -o remount,bind,ro {folder}"],
        capture_output=True,
    )
    if probe.returncode != 0:
        pytest.skip("running as root without the right to mount a read-only folder")
    mount = f'mount --bind {folder} {folder} && mount -o remount,bind,ro {folder} && exec "$@"'
    return ("unshare", "-m", "sh", "-c", mount, "sh")


@pytest.mark.parametrize("where", ["the folder", "its parent"])
def test_a_read_only_runs_dir_is_refused_before_hydra_writes_there(tmp_path, where):
    locked = tmp_path / "locked"
    locked.mkdir()
    runs_dir = locked if where == "the folder" else locked / "runs"
    prefix = read_only_prefix(locked)
    try:
        env = tool_env(tmp_path)
        done = run_process("mesh-train", *FAST, f"runs_dir={runs_dir}", env=env, cwd=tmp_path, prefix=prefix)
    finally:
        locked.chmod(0o755)
    line = assert_refused(done, f"runs_dir='{runs_dir}' is invalid", tmp_path, runs_dir)
    assert "not writable" in line
    assert list(locked.iterdir()) == []


@pytest.fixture(scope="module")
def small_store(tmp_path_factory) -> Path:
    """A store of one finished run with a metric, as prepare_sqlite_store leaves it (WAL mode)."""
    import mlflow

    from experiments.store.sqlite import forget_engine, prepare_sqlite_store

    db = tmp_path_factory.mktemp("read-only") / "mlflow.db"
    uri = f"sqlite:///{db}"
    prepare_sqlite_store(uri)
    client = mlflow.MlflowClient(uri)
    run = client.create_run(client.create_experiment("kept"), run_name="kept-run", tags={"scheme": "mesh"})
    client.log_metric(run.info.run_id, "val_loss", 4.5, step=10)
    client.set_terminated(run.info.run_id, "FINISHED")
    forget_engine(uri)
    return db


def test_a_read_only_store_is_read_by_mesh_results_and_refused_as_read_only_by_mesh_train(small_store, tmp_path):
    """Before: both said "the MLflow store ... is damaged (unable to open database file)"."""
    folder = tmp_path / "store"
    shutil.copytree(small_store.parent, folder)
    before = sorted(p.name for p in folder.iterdir())
    prefix = read_only_prefix(folder)
    try:
        env = tool_env(tmp_path)
        out = tmp_path / "report"
        done = run_process(
            "mesh-results", "kept", "--runs-dir", str(folder), "--out", str(out), env=env, cwd=tmp_path, prefix=prefix
        )
        assert done.returncode == 0, done.stderr
        assert "damaged" not in done.stderr
        said = [line for line in done.stderr.splitlines() if "read-only" in line]
        assert said == [
            f"[mesh] the MLflow store {folder / 'mlflow.db'} is read-only ({READ_ONLY}): read as it is, nothing written to it"
        ]
        assert "1 runs (1 finished) -> 1 rows" in done.stdout
        uri = f"sqlite:///{folder / 'mlflow.db'}"
        train = run_process(
            "mesh-train",
            *FAST,
            f"runs_dir={tmp_path / 'runs'}",
            f"tracking.tracking_uri={uri}",
            env=env,
            cwd=tmp_path,
            prefix=prefix,
        )
    finally:
        folder.chmod(0o755)
    assert sorted(p.name for p in folder.iterdir()) == before  # nothing written beside the store either
    line = assert_refused(train, "the MLflow store", tmp_path, tmp_path / "runs")
    assert f"is read-only ({READ_ONLY}); this command writes to it" in line and "damaged" not in line


@pytest.mark.skipif(os.geteuid() != 0, reason="mounting a small tmpfs (a full disk) needs root")
def test_a_disk_that_fills_while_mesh_results_writes_says_so_in_one_line_and_keeps_the_old_report(
    small_store, tmp_path
):
    """Before: pandas' or matplotlib's traceback, "No space left on device" at its end."""
    from experiments.store.sqlite import forget_engine

    disk = tmp_path / "disk"
    disk.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=256k", "tmpfs", str(disk)], check=True)
    try:
        out = disk / "report"
        out.mkdir()
        (out / "report.md").write_text("the report of yesterday\n")
        with contextlib.suppress(OSError), (disk / "filler").open("wb", buffering=0) as filler:
            while True:
                filler.write(bytes(4096))
                filler.flush()
        args = ("kept", "--runs-dir", str(small_store.parent), "--out", str(out))
        done = run_process("mesh-results", *args, env=tool_env(tmp_path), cwd=tmp_path)
        lines = [line for line in done.stderr.splitlines() if line.strip()]
        assert done.returncode == 2 and len(lines) == 1, done.stderr
        assert lines[0].startswith(f"error: no space left on the filesystem at {disk} (")
        assert lines[0].endswith(
            f"while writing the report to {out}: {out} is as it was; freed space lets the same command write it"
        )
        assert [p.name for p in out.iterdir()] == ["report.md"]
        assert (out / "report.md").read_text() == "the report of yesterday\n"
        (disk / "filler").unlink()
        # The full disk is the first call's (a process of its own, as a user meets it); the rerun
        # only writes the report, in this process. Its engine is let go afterwards: the module's
        # store is left as a process that exits leaves it (no connection, no -wal/-shm beside it).
        try:
            again = run_tool("mesh-results", *args, env=tool_env(tmp_path), cwd=tmp_path)
        finally:
            forget_engine(f"sqlite:///{small_store.resolve()}")
        assert again.returncode == 0, again.stderr
        assert "the report of yesterday" not in (out / "report.md").read_text()
    finally:
        subprocess.run(["umount", "-l", str(disk)], check=False)


READ_ONLY = (
    "its filesystem is mounted read-only" if os.geteuid() == 0 else "no write permission on the file or its folder"
)


@pytest.mark.parametrize(
    ("args", "field"),
    [
        (["--limit", "-1"], "--limit=-1 is invalid"),
        (["--limit", "2.5"], "--limit=2.5 is invalid"),
        (["--shots", "99"], "--shots=99 is invalid: few-shot counts are integers from 0 to 25"),
        (["--shots", "0,-5"], "--shots=0,-5 is invalid"),
    ],
)
def test_mesh_eval_refuses_bad_settings_before_loading_anything(tmp_path, args, field):
    done = cli("mesh-eval", str(tmp_path / "no-run-needed"), "--tasks", "local", *args, tmp=tmp_path)
    assert_refused(done, field, tmp_path, tmp_path / "runs")


def test_mesh_eval_refuses_more_shots_than_a_local_task_has(tiny_run, tmp_path):
    # tiny_run is shared: another test may have evaluated it already; this refusal writes nothing.
    before = sorted((tiny_run.run_dir / "eval").rglob("*")) if (tiny_run.run_dir / "eval").exists() else None
    done = cli("mesh-eval", str(tiny_run.run_dir), "--tasks", "local", "--shots", "11", tmp=tmp_path)
    line = assert_refused(done, "--shots=11 is invalid for task mesh_", tmp_path, tmp_path / "runs")
    assert "has 10 examples" in line
    after = sorted((tiny_run.run_dir / "eval").rglob("*")) if (tiny_run.run_dir / "eval").exists() else None
    assert after == before


def test_mesh_probe_refuses_an_unknown_mlflow_run_before_probing(tiny_run, tmp_path):
    before = tiny_run.client.get_run(tiny_run.run_id).data.metrics
    done = cli("mesh-probe", str(tiny_run.run_dir), "--mlflow-run", "nosuchrun", tmp=tmp_path)
    line = assert_refused(done, "--mlflow-run=nosuchrun is invalid: no such MLflow run", tmp_path, tmp_path)
    assert tiny_run.tracking_uri.removeprefix("sqlite:///") in line
    assert not (tiny_run.run_dir / "probes" / "cli").exists()  # nothing was probed
    assert tiny_run.client.get_run(tiny_run.run_id).data.metrics == before
    assert runs_in(tiny_run.runs_dir / "mlflow.db") == 1


# --- the memory check, in plan_run ------------------------------------------------------------


def test_allow_large_passes_the_memory_check_and_does_not_change_the_hash(tmp_path):
    big = ["model=tiny", "layout=1+2R1000+1", "scheme=mesh", f"runs_dir={tmp_path}"]
    with pytest.raises(InputError, match=r"^layout=1\+2R1000\+1: the training step needs about [\d.]+ GB \(params"):
        plan_run(compose_config(big))
    plan = plan_run(compose_config([*big, "allow_large=true"]))
    assert plan.model_config.loops == 1000
    assert (
        plan.config_hash
        == plan_run(compose_config([*big[:-1], f"runs_dir={tmp_path}", "allow_large=true"])).config_hash
    )
    small = plan_run(compose_config(["model=tiny", f"runs_dir={tmp_path}"]))
    assert (
        small.config_hash
        == plan_run(compose_config(["model=tiny", f"runs_dir={tmp_path}", "allow_large=true"])).config_hash
    )
    assert not (tmp_path / "mlflow.db").exists() and not (tmp_path / "mesh").exists()  # planning creates nothing


def test_the_memory_line_gives_the_estimate_its_parts_and_the_ways_out(tmp_path):
    cfg = compose_config(["model=tiny", "layout=1+2R1000+1", "scheme=mesh", "data.batch_size=1", "data.seq_len=16"])
    train = OmegaConf.to_object(cfg)
    model_config = ModelConfig.from_preset("tiny", layout="1+2R1000+1", scheme="mesh")
    with pytest.raises(InputError) as info:
        check_memory(train, model_config, available=18 * 10**9)
    message = str(info.value)
    assert message.startswith("layout=1+2R1000+1: the training step needs about ")
    assert "(params+optimizer 2.1, activations " in message and " incl. MeSH coefficients " in message
    assert message.endswith(
        "but 18.0 GB are available; lower K, batch or seq_len, use activation_checkpointing=true, or pass allow_large=true"
    )
    assert "\n" not in message
    estimate = check_memory(train, model_config, available=10**15)
    assert estimate.total > 30e9 and estimate.mesh_coefficients > 30e9  # ~K^3/2 values per token, B = K+3
    sharded = estimate_step_memory(model_config, 1, 16, param_shards=8)  # FSDP over 8 devices
    assert sharded.params_and_optimizer == pytest.approx(estimate.params_and_optimizer / 8, rel=1e-6)
    assert sharded.activations == estimate.activations


@pytest.mark.parametrize(
    ("layout", "scheme", "batch", "seq"),
    [
        ("1+2R2+1", "base", 4, 64),
        ("1+2R20+1", "mesh", 4, 64),
        ("1+2R60+1", "mesh", 1, 16),
        ("2+2+2+1", "dynamic", 2, 32),
    ],
)
def test_the_estimate_covers_what_autograd_keeps(layout, scheme, batch, seq):
    """Exact counts: the closed-form parameters equal the built model's, and the activation
    estimate is at least every tensor autograd saves for backward (measured by hooks)."""
    config = ModelConfig.from_preset("tiny", layout=layout, scheme=scheme)
    model = build_model(config)
    assert parameter_count(config) == count_parameters(model)["total"]
    parameters = {p.untyped_storage().data_ptr() for p in model.parameters()}
    saved: dict[int, int] = {}

    def pack(tensor):
        storage = tensor.untyped_storage()
        if storage.data_ptr() not in parameters:
            saved[storage.data_ptr()] = storage.nbytes()
        return tensor

    ids = torch.randint(0, config.vocab_size, (batch, seq))
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda tensor: tensor):
        model(ids, labels=ids, return_logits=False)
    estimate = estimate_step_memory(config, batch, seq)
    assert estimate.activations >= sum(saved.values())
    assert estimate.activations <= 2 * sum(saved.values()) + 8e6  # and not wildly above


# --- the store checks -------------------------------------------------------------------------


def test_store_checks_answer_in_one_line(tmp_path):
    (tmp_path / "afile").write_text("x")
    (tmp_path / "empty.db").write_bytes(b"")
    check_tracking_uri(f"sqlite:///{tmp_path}/new/mlflow.db")  # creatable
    check_tracking_uri(f"sqlite:///{tmp_path}/empty.db")  # sqlite takes an empty file as a new database
    assert not (tmp_path / "new").exists()  # the check creates nothing
    cases = {
        f"sqlite:///{tmp_path}/afile/mlflow.db": "is a file, not a folder",
        f"sqlite:///{tmp_path}": "names a folder",
        "file:///tmp/mlruns": "file store",
        "postgresql://user:secret@nowhere/db": "postgresql://user:***@nowhere/db",
        "mysql+pymysql://nowhere/db": "mysql+pymysql://nowhere/db",
        "http://127.0.0.1:9": "does not answer",
    }
    for uri, fragment in cases.items():
        with pytest.raises(TrackingError) as info:
            check_tracking_uri(uri, timeout=2)
        assert fragment in str(info.value) and "\n" not in str(info.value)
        assert "secret" not in str(info.value)
    with pytest.raises(ConfigError, match="runs_dir=.* is invalid: it is a file"):
        check_runs_dir(tmp_path / "afile")


class HealthOnly(http.server.BaseHTTPRequestHandler):
    """A web server that answers /health like MLflow does, and nothing else."""

    def do_GET(self):  # noqa: N802 - http.server's name
        status, body = (200, b"OK") if self.path == "/health" else (404, b"<html>not found</html>")
        self.send_response(status)
        self.send_header("Content-Type", "text/html")
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args):
        pass


@pytest.mark.slow
def test_a_server_that_answers_health_but_is_not_mlflow_is_refused(tmp_path):
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), HealthOnly)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    uri = f"http://127.0.0.1:{server.server_address[1]}"
    try:
        assert urllib.request.urlopen(f"{uri}/health", timeout=5).status == 200
        runs_dir = tmp_path / "runs"
        done = cli("mesh-train", *FAST, f"tracking.tracking_uri={uri}", f"runs_dir={runs_dir}", tmp=tmp_path)
        line = assert_refused(
            done, f"tracking_uri='{uri}' answers but is not an MLflow tracking server", tmp_path, runs_dir
        )
        assert "HTTP 404" in line
    finally:
        server.shutdown()


@pytest.mark.slow
def test_a_real_mlflow_server_passes_the_check(tmp_path, mlflow_server):
    uri = mlflow_server
    check_tracking_uri(uri)
    check_tracking_uri(f"{uri}/")
    plan = plan_run(compose_config(["model=tiny", f"tracking.tracking_uri={uri}", f"runs_dir={tmp_path}"]))
    assert plan.tracking_uri == uri
    with pytest.raises(TrackingError, match="answers but is not an MLflow tracking server"):
        check_tracking_uri(f"{uri}/not-here")
