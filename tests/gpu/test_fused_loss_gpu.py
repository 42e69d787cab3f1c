"""Liger's fused linear cross-entropy against the chunked torch loss and the full-logits
reference, on CUDA: values and gradients, under bf16 autocast and in fp32, and inside the model.

Not part of the default suite (pyproject's norecursedirs excludes tests/gpu): run it on a GPU
machine with ``make test-gpu``. Without CUDA or liger-kernel every test fails, loudly, instead
of skipping: a GPU run that checked nothing must not look green.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from mesh_model import ModelConfig, build_model
from mesh_model.loss import BACKEND_ENV, IGNORE_INDEX, linear_cross_entropy, loss_backend

# pythia-160m's head on a batch of 2 x 1024 tokens: many chunks for both backends.
TOKENS, WIDTH, VOCAB = 2048, 768, 50304


@pytest.fixture(autouse=True)
def cuda_and_liger(monkeypatch: pytest.MonkeyPatch) -> None:
    if not torch.cuda.is_available():
        pytest.fail("tests/gpu needs a CUDA device", pytrace=False)
    monkeypatch.delenv(BACKEND_ENV, raising=False)
    if loss_backend("cuda") != "liger":
        pytest.fail("tests/gpu needs liger-kernel (pip install -e '.[gpu]')", pytrace=False)
    monkeypatch.setattr(torch.backends.cuda.matmul, "allow_tf32", False)  # fp32 means fp32 here


def assert_relative_close(got: torch.Tensor, want: torch.Tensor, tolerance: float) -> None:
    """||got - want|| / ||want|| below ``tolerance``: bf16 rounding differs element by element."""
    error = ((got.float() - want.float()).norm() / want.float().norm()).item()
    assert error < tolerance, f"relative error {error:.2e} >= {tolerance:.0e}"


def inputs(dtype: torch.dtype = torch.float32, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    generator = torch.Generator("cuda").manual_seed(seed)
    hidden = torch.randn(TOKENS, WIDTH, device="cuda", generator=generator, dtype=dtype)
    weight = 0.02 * torch.randn(VOCAB, WIDTH, device="cuda", generator=generator, dtype=dtype)
    targets = torch.randint(0, VOCAB, (TOKENS,), device="cuda", generator=generator)
    targets[::9] = IGNORE_INDEX
    return hidden.requires_grad_(), weight.requires_grad_(), targets


def loss_and_grads(backend: str, autocast: bool, dtype: torch.dtype = torch.float32):
    hidden, weight, targets = inputs(dtype)
    with torch.autocast("cuda", dtype=torch.bfloat16, enabled=autocast):
        if backend == "reference":
            logits = hidden @ weight.t()
            loss = F.cross_entropy(logits.float(), targets, ignore_index=IGNORE_INDEX)
        else:
            loss = linear_cross_entropy(hidden, weight, targets, backend=backend)
    grads = torch.autograd.grad(2.0 * loss, (hidden, weight))  # a grad_output other than 1
    return loss, grads


def test_auto_picks_liger_on_cuda() -> None:
    assert loss_backend("cuda") == "liger"
    assert loss_backend("cpu") == "chunked"


@pytest.mark.parametrize("backend", ["liger", "chunked"])
def test_fp32_equals_the_full_logits(backend: str) -> None:
    loss, grads = loss_and_grads(backend, autocast=False)
    want_loss, want_grads = loss_and_grads("reference", autocast=False)
    assert loss.dtype == torch.float32
    torch.testing.assert_close(loss, want_loss, rtol=1e-5, atol=1e-5)
    for got, want in zip(grads, want_grads, strict=True):
        assert got.dtype == want.dtype
        torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4 * want.abs().max().item())


@pytest.mark.parametrize("backend", ["liger", "chunked"])
def test_bf16_autocast_keeps_fp32_softmax_statistics(backend: str) -> None:
    """bf16 logits from the autocast matmul, softmax and loss over them in fp32, fp32 gradients."""
    loss, grads = loss_and_grads(backend, autocast=True)
    want_loss, want_grads = loss_and_grads("reference", autocast=True)
    assert loss.dtype == torch.float32
    torch.testing.assert_close(loss, want_loss, rtol=1e-4, atol=1e-4)
    for got, want in zip(grads, want_grads, strict=True):
        assert got.dtype == torch.float32
        assert_relative_close(got, want, 1e-2)


def test_liger_and_chunked_agree_with_bf16_weights() -> None:
    """bf16 parameters (no autocast): the weight's gradient is summed in fp32 by both."""
    liger_loss, liger_grads = loss_and_grads("liger", autocast=False, dtype=torch.bfloat16)
    chunked_loss, chunked_grads = loss_and_grads("chunked", autocast=False, dtype=torch.bfloat16)
    torch.testing.assert_close(liger_loss, chunked_loss, rtol=1e-3, atol=1e-3)
    for got, want in zip(liger_grads, chunked_grads, strict=True):
        assert got.dtype == torch.bfloat16
        assert_relative_close(got, want, 2e-2)


def test_every_target_ignored_gives_zero_loss() -> None:
    hidden, weight, targets = inputs()
    targets.fill_(IGNORE_INDEX)
    for backend in ("liger", "chunked"):
        loss = linear_cross_entropy(hidden, weight, targets, backend=backend)
        assert loss.item() == 0.0
        assert torch.autograd.grad(loss, hidden)[0].abs().max().item() == 0.0


@pytest.mark.parametrize("scheme", ["base", "mesh"])
def test_model_training_path_matches_across_backends(scheme: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """The model's training path (``return_logits=False``) under bf16 autocast, liger vs chunked."""
    torch.manual_seed(0)
    model = build_model(ModelConfig.from_preset("mini", scheme=scheme)).cuda()
    ids = torch.randint(0, model.config.vocab_size, (4, 256), device="cuda")
    labels = ids.clone()
    labels[:, :7] = IGNORE_INDEX
    results = {}
    for backend in ("liger", "chunked"):
        monkeypatch.setenv(BACKEND_ENV, backend)
        with torch.autocast("cuda", dtype=torch.bfloat16):
            loss = model(ids, labels=labels, return_logits=False).loss
        results[backend] = (loss, torch.autograd.grad(loss, list(model.parameters())))
    torch.testing.assert_close(results["liger"][0], results["chunked"][0], rtol=1e-4, atol=1e-4)
    for got, want in zip(results["liger"][1], results["chunked"][1], strict=True):
        assert_relative_close(got, want, 2e-2)
