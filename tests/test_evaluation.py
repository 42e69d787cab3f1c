"""mesh-eval: the lm-eval adapter against direct computation, perplexity, local tasks into MLflow."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import mlflow
import numpy as np
import pytest
import torch
from helpers import run_tool
from lm_eval.api.instance import Instance
from lm_eval.evaluator import simple_evaluate

from experiments.data import DataConfig, prepare
from experiments.evaluation.evaluate import EvalSettings, evaluate
from experiments.evaluation.lm_eval_model import MeshLM, rolling_windows
from experiments.evaluation.perplexity import perplexity
from experiments.evaluation.suites import HEADLINE_METRIC, LOCAL_TASKS_DIR, SUITES, task_manager, task_specs
from mesh_model import ModelConfig, build_model

CONTEXT = 24  # the test model's max_seq_len: long texts need truncation and several windows
TEXT = (
    "Now is the winter of our discontent\nMade glorious summer by this sun of York;\n"
    "And all the clouds that lour'd upon our house\nIn the deep bosom of the ocean buried."
)


@pytest.fixture(scope="module")
def tokenizer():
    return prepare(DataConfig(seq_len=64)).tokenizer  # the default run's BPE (cached by make data / training)


@pytest.fixture(scope="module")
def model():
    torch.manual_seed(0)
    config = ModelConfig.from_preset("tiny", layout="1+2R2+1", scheme="mesh", vocab_size=2048, max_seq_len=CONTEXT)
    return build_model(config).eval()


@pytest.fixture(scope="module")
def lm(model, tokenizer):
    return MeshLM(model, tokenizer, batch_size="4", device="cuda")  # lm-eval's CLI: cuda and a string


def requests(kind: str, *args: tuple) -> list[Instance]:
    return [Instance(kind, {}, a, i) for i, a in enumerate(args)]


@torch.inference_mode()
def logprobs(model, ids: list[int]) -> torch.Tensor:
    """(len(ids), V) log-probabilities of the next token after each position, straight from the model."""
    return torch.log_softmax(model(torch.tensor([ids])).logits[0].float(), dim=-1)


def direct_loglikelihood(model, lm, context: str, continuation: str) -> tuple[float, bool]:
    whole, ctx = lm.tok_encode(context + continuation), lm.tok_encode(context)
    cont = whole[len(ctx) :]
    window = whole[-(CONTEXT + 1) :]  # the context truncated from the left, the continuation kept
    lp = logprobs(model, window[:-1])[-len(cont) :]
    target = torch.tensor(cont)
    return float(lp.gather(1, target[:, None]).sum()), bool((lp.argmax(-1) == target).all())


# --- the adapter, number for number -----------------------------------------------------------


def test_loglikelihood_equals_the_sum_of_token_logprobs(model, lm):
    assert lm.device.type == "cpu" and lm.batch_size == 4 and lm.max_length == CONTEXT
    short = ("Now is the winter of our", " discontent")
    long = (TEXT, " And so farewell.")  # ~50 tokens of context: only the last ones fit
    assert len(lm.tok_encode(long[0])) > CONTEXT
    got = lm.loglikelihood(requests("loglikelihood", short, long))
    for (context, continuation), (value, greedy) in zip((short, long), got, strict=True):
        expected, expected_greedy = direct_loglikelihood(model, lm, context, continuation)
        assert value == pytest.approx(expected, abs=1e-5)
        assert greedy == expected_greedy
    # The argmax continuation is greedy.
    ids = lm.tok_encode(short[0])
    best = int(logprobs(model, ids)[-1].argmax())
    ((value, greedy),) = lm.loglikelihood(requests("loglikelihood", (short[0], lm.tok_decode([best]))))
    assert greedy and value == pytest.approx(float(logprobs(model, ids)[-1, best]), abs=1e-5)


def test_rolling_loglikelihood_short_and_long(model, lm):
    short = "Now is the winter of our discontent"
    ids = lm.tok_encode(short)
    assert len(ids) < CONTEXT
    lp = logprobs(model, [lm.eot_token_id, *ids[:-1]])
    expected = float(lp.gather(1, torch.tensor(ids)[:, None]).sum())
    (value,) = lm.loglikelihood_rolling(requests("loglikelihood_rolling", (short,)))
    assert value == pytest.approx(expected, abs=1e-5)

    ids = lm.tok_encode(TEXT)
    assert len(ids) > 2 * CONTEXT
    windows = rolling_windows(ids, lm.eot_token_id, CONTEXT)
    assert sum(n for _, n in windows) == len(ids)  # every token predicted exactly once
    assert all(len(tokens) <= CONTEXT + 1 for tokens, _ in windows)
    assert [len(t) for t, _ in windows[1:]] == [CONTEXT + 1] * (len(windows) - 1)  # later windows: full context
    scored = [t for tokens, n in windows for t in tokens[-n:]]
    assert scored == ids
    expected = 0.0
    for tokens, n in windows:
        lp = logprobs(model, tokens[:-1])[-n:]
        expected += float(lp.gather(1, torch.tensor(tokens[-n:])[:, None]).sum())
    (value,) = lm.loglikelihood_rolling(requests("loglikelihood_rolling", (TEXT,)))
    assert value == pytest.approx(expected, abs=1e-4)
    # A continuation longer than the context is scored on the same windows.
    ((from_empty, _),) = lm.loglikelihood(requests("loglikelihood", ("", TEXT)))
    assert from_empty == pytest.approx(value, abs=1e-4)


def manual_greedy(model, lm, context: str, until: list[str], max_new: int) -> str:
    ids, new = lm.tok_encode(context), []
    for _ in range(max_new):
        token = int(logprobs(model, (ids + new)[-CONTEXT:])[-1].argmax())
        if token == lm.eot_token_id:
            break
        new.append(token)
        text = lm.tok_decode(new)
        if any(stop in text for stop in until):
            return text[: min(text.find(stop) for stop in until if stop in text)]
    return lm.tok_decode(new)


def test_generate_until_is_greedy_and_stops(model, lm):
    free = manual_greedy(model, lm, TEXT, [], 12)  # a long context: left-truncated as it grows
    assert len(lm.tok_encode(free)) >= 6
    stop = free[len(free) // 2 : len(free) // 2 + 2]
    expected = manual_greedy(model, lm, TEXT, [stop], 12)
    assert expected == free[: free.find(stop)] and len(expected) < len(free)
    got = lm.generate_until(
        requests(
            "generate_until",
            (TEXT, {"until": [stop], "max_gen_toks": 12}),
            (TEXT, {"until": stop, "max_gen_toks": 3}),
            ("Now is", {"until": ["\n\n"], "max_gen_toks": 5, "do_sample": False}),
        )
    )
    assert got[0] == expected
    assert got[1] == manual_greedy(model, lm, TEXT, [stop], 3)
    assert got[2] == manual_greedy(model, lm, "Now is", ["\n\n"], 5)


def test_batching_gives_the_numbers_of_batch_size_1(model, tokenizer, lm):
    one = MeshLM(model, tokenizer, batch_size=1)
    pairs = [("Now is", " the"), (TEXT, " York"), ("In the deep", " bosom of the ocean"), ("And", " all")]
    batched, single = (
        lm.loglikelihood(requests("loglikelihood", *pairs)),
        one.loglikelihood(requests("loglikelihood", *pairs)),
    )
    for (a, ga), (b, gb) in zip(batched, single, strict=True):
        assert a == pytest.approx(b, abs=1e-4) and ga == gb
    texts = [("Now is the winter",), (TEXT,), ("York",)]
    rolled = lm.loglikelihood_rolling(requests("loglikelihood_rolling", *texts))
    assert rolled == pytest.approx(one.loglikelihood_rolling(requests("loglikelihood_rolling", *texts)), abs=1e-4)
    gens = [(TEXT, {"until": ["\n"], "max_gen_toks": 6}), ("Now", {"until": ["."], "max_gen_toks": 4})]
    assert lm.generate_until(requests("generate_until", *gens)) == one.generate_until(requests("generate_until", *gens))


def test_perplexity_equals_the_models_own_loss(model):
    tokens = np.random.default_rng(0).integers(0, 2048, size=16 * 7 + 5).astype(np.uint16)
    result = perplexity(model, tokens, seq_len=16, batch_size=3, max_windows=6)
    with torch.inference_mode():
        ids = torch.from_numpy(tokens[: 6 * 16].astype(np.int64)).view(6, 16)
        loss = float(model(ids, labels=ids).loss)
    assert result["windows"] == 6 and result["tokens"] == 6 * 15
    assert result["loss"] == pytest.approx(loss, abs=1e-5)
    assert result["ppl"] == pytest.approx(np.exp(loss), rel=1e-5)
    assert perplexity(model, tokens[:10], seq_len=16) is None


# --- the local tasks ----------------------------------------------------------------------------


def test_suites_and_headline_metrics():
    assert SUITES["paper9"] == [
        "lambada_openai",
        "lambada_standard",
        "piqa",
        "hellaswag",
        "arc_easy",
        "arc_challenge",
        "sciq",
        "winogrande",
        "mmlu_continuation",
    ]
    assert [HEADLINE_METRIC[t] for t in SUITES["paper9"]].count("acc_norm") == 5
    assert all(t in HEADLINE_METRIC for t in SUITES["local"])
    size = sum(p.stat().st_size for p in LOCAL_TASKS_DIR.iterdir())
    assert size < 100_000


@pytest.mark.slow
def test_local_tasks_offline_from_any_folder_without_double_spaces(model, tokenizer, tmp_path, monkeypatch):
    """Relative data_files work from another working directory; 5-shot prompts have single spaces."""
    mine = tmp_path / "my_tasks"
    mine.mkdir()
    yaml = (LOCAL_TASKS_DIR / "mesh_lambada.yaml").read_text()
    (mine / "my_lambada.yaml").write_text(yaml.replace("task: mesh_lambada", "task: my_lambada"))
    for split in ("test", "train"):
        shutil.copy(LOCAL_TASKS_DIR / f"mesh_lambada_{split}.jsonl", mine)
    monkeypatch.chdir(tmp_path)  # neither folder is the working directory

    seen: list[tuple] = []

    class Recording(MeshLM):
        def loglikelihood(self, reqs, disable_tqdm=False):
            seen.extend(r.args for r in reqs)
            return super().loglikelihood(reqs, disable_tqdm)

    manager = task_manager(["my_lambada", "mesh_lambada"], [mine])
    specs = task_specs(manager, ["my_lambada"])
    assert specs[0]["dataset_kwargs"]["data_files"]["test"] == str(mine / "mesh_lambada_test.jsonl")
    results = simple_evaluate(
        model=Recording(model, tokenizer, batch_size=8),
        tasks=specs,
        num_fewshot=5,
        limit=3,
        task_manager=manager,
        bootstrap_iters=0,
        log_samples=False,
    )
    assert 0 <= results["results"]["my_lambada"]["acc,none"] <= 1
    assert len(seen) == 3
    for context, continuation in seen:
        assert context.count("\n\n") == 5 and "  " not in context
        assert continuation.startswith(" ") and not continuation.startswith("  ")
    # lm-eval's default target delimiter is what would double the space (its own lambada tasks do).
    seen.clear()
    default = {**specs[0], "task": "my_lambada_default_delimiter", "target_delimiter": " "}
    simple_evaluate(
        model=Recording(model, tokenizer),
        tasks=[default],
        num_fewshot=5,
        limit=1,
        task_manager=manager,
        bootstrap_iters=0,
        log_samples=False,
    )
    assert "  " in seen[0][0]


@pytest.mark.slow
def test_local_tasks_at_0_and_5_shots_land_in_the_mlflow_run(tiny_run):
    trained, client, steps = tiny_run.result, tiny_run.client, tiny_run.steps
    settings = EvalSettings(
        target=trained["run_dir"],
        tasks=["local"],
        shots=[0, 5],
        limit=8,
        batch_size=8,
        ppl_windows=16,  # the windows training validated on: data.val_batches=2 x data.batch_size=8
        bootstrap_iters=0,
    )
    report = evaluate(settings)
    run = client.get_run(trained["run_id"])
    metrics = run.data.metrics
    # Perplexity on the same windows as training's last validation: the same number.
    assert metrics["eval/loss/shakespeare"] == pytest.approx(trained["val/shakespeare/loss"], rel=1e-5)
    assert metrics["eval/ppl/shakespeare"] == pytest.approx(np.exp(metrics["eval/loss/shakespeare"]), rel=1e-5)
    for shots in (0, 5):
        prefix = f"eval/{shots}shot"
        headline = [metrics[f"{prefix}/{task}/{HEADLINE_METRIC[task]}"] for task in SUITES["local"]]
        assert metrics[f"{prefix}/avg"] == pytest.approx(sum(headline) / 3)
        assert 0 <= metrics[f"{prefix}/mesh_choice/acc"] <= 1 and f"{prefix}/mesh_lambada/perplexity" in metrics
        assert report["lm_eval"][str(shots)]["n-shot"]["mesh_choice"] == shots
        assert report["lm_eval"][str(shots)]["n-samples"]["mesh_generate"]["effective"] == 8
    history = client.get_metric_history(trained["run_id"], "eval/5shot/avg")
    assert [m.step for m in history] == [steps]  # the checkpoint's training step
    (artifact,) = client.list_artifacts(trained["run_id"], "eval")
    local = mlflow.artifacts.download_artifacts(
        run_id=trained["run_id"], artifact_path=artifact.path, tracking_uri=tiny_run.tracking_uri
    )
    saved = json.loads(Path(local).read_text())
    assert saved["metrics"] == report["metrics"] and set(saved["lm_eval"]) == {"0", "5"}
    assert saved["lm_eval"]["0"]["results"]["mesh_lambada"]["acc,none"] == metrics["eval/0shot/mesh_lambada/acc"]

    # By MLflow run id: the run_dir tag finds the checkpoint; perplexity only, logged again at the same step.
    from experiments.evaluation.cli import main

    uri = tiny_run.tracking_uri
    assert main(["--run", trained["run_id"], "--tracking-uri", uri, "--tasks", "none", "--ppl-windows", "16"]) == 0
    history = client.get_metric_history(trained["run_id"], "eval/loss/shakespeare")
    assert [m.step for m in history] == [steps, steps] and history[0].value == pytest.approx(history[1].value, abs=1e-6)


def test_mesh_lm_from_checkpoint_and_the_registry(tiny_run):
    from lm_eval.api.registry import get_model

    from experiments.checkpoints import load_model

    assert get_model("mesh") is MeshLM
    checkpoint = tiny_run.run_dir / "checkpoints" / "last.ckpt"
    lm = MeshLM.from_checkpoint(checkpoint, device="cuda", batch_size="2")  # lm-eval's CLI defaults
    assert lm.device.type == ("cuda" if torch.cuda.is_available() else "cpu") and lm.batch_size == 2
    model, step = load_model(checkpoint)
    assert step == tiny_run.steps and lm.tokenizer.vocab_size == 2048
    for mine, theirs in zip(lm.model.state_dict().values(), model.state_dict().values(), strict=True):
        assert torch.equal(mine.cpu(), theirs)


def test_mesh_eval_on_a_missing_path_says_so_in_one_line(tmp_path):
    missing = tmp_path / "nope" / "last.ckpt"
    result = run_tool("mesh-eval", str(missing), "--tasks", "local")
    assert result.returncode == 2
    assert result.stderr.strip().splitlines() == [
        f"error: {missing} does not exist (expected a checkpoint file or a run directory)"
    ]


def test_mesh_eval_errors_are_one_line(tmp_path, capsys):
    from experiments.evaluation.cli import main

    (tmp_path / "run").mkdir()
    assert main([str(tmp_path / "run"), "--tasks", "none"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [f"error: {tmp_path / 'run'} has no checkpoints/last.ckpt (not a mesh-train run directory?)"]
    with pytest.raises(SystemExit) as exit_info:
        main(["--shots", "0,x", str(tmp_path)])
    assert exit_info.value.code == 2
    assert capsys.readouterr().err.strip().splitlines() == [
        "error: argument --shots: '0,x' is not a comma-separated list of integers"
    ]
    assert main(["--tasks", "local"]) == 2
    assert capsys.readouterr().err.strip().splitlines() == [
        "error: give a checkpoint or run directory, or --run RUN_ID (one of them)"
    ]
