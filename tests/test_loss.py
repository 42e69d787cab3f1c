"""The chunked linear cross-entropy equals the loss and gradients of the full logits, and the
backend choice (chunked, Liger's CUDA kernel) is made and refused as documented. Liger itself
is compared on a GPU in tests/gpu/test_fused_loss_gpu.py."""

from __future__ import annotations

import sys

import pytest
import torch
import torch.nn.functional as F

from mesh_model import ConfigError, ModelConfig, build_model
from mesh_model import loss as loss_module
from mesh_model.loss import BACKEND_ENV, IGNORE_INDEX, chunk_rows, linear_cross_entropy, loss_backend, shifted_targets


def test_shifted_targets_pad_the_last_position() -> None:
    labels = torch.tensor([[1, 2, 3], [4, 5, 6]])
    assert shifted_targets(labels).tolist() == [2, 3, IGNORE_INDEX, 5, 6, IGNORE_INDEX]


@pytest.mark.parametrize("vocab", [50, 9000])  # one chunk / several chunks (128 rows each at 9000)
def test_loss_and_gradients_equal_the_full_logits(vocab: int) -> None:
    torch.manual_seed(0)
    tokens, d = 300, 16
    assert (tokens > chunk_rows(vocab)) == (vocab == 9000)
    hidden = torch.randn(tokens, d, dtype=torch.float64, requires_grad=True)
    weight = torch.randn(vocab, d, dtype=torch.float64, requires_grad=True)
    targets = torch.randint(0, vocab, (tokens,))
    targets[::7] = IGNORE_INDEX
    expected = F.cross_entropy(hidden @ weight.t(), targets, ignore_index=IGNORE_INDEX)
    expected_grads = torch.autograd.grad(expected * 3.0, (hidden, weight))
    loss = linear_cross_entropy(hidden, weight, targets)
    grads = torch.autograd.grad(loss * 3.0, (hidden, weight))
    torch.testing.assert_close(loss, expected, rtol=1e-12, atol=1e-12)
    for got, want in zip(grads, expected_grads, strict=True):
        torch.testing.assert_close(got, want, rtol=1e-9, atol=1e-12)


def test_without_gradients_gives_the_same_loss() -> None:
    torch.manual_seed(1)
    hidden, weight = torch.randn(200, 8), torch.randn(3000, 8)
    targets = torch.randint(0, 3000, (200,))
    with torch.no_grad():
        got = linear_cross_entropy(hidden, weight, targets)
    torch.testing.assert_close(got, F.cross_entropy(hidden @ weight.t(), targets), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("scheme", ["base", "mesh"])
def test_model_loss_only_path_matches_the_logits_path(scheme: str) -> None:
    torch.manual_seed(0)
    model = build_model(ModelConfig(scheme=scheme, vocab_size=300))
    ids = torch.randint(0, 300, (2, 24))
    labels = ids.clone()
    labels[0, 5] = IGNORE_INDEX
    full = model(ids, labels=labels)
    full_grads = torch.autograd.grad(full.loss, list(model.parameters()))
    fused = model(ids, labels=labels, return_logits=False)
    assert fused.logits is None
    fused_grads = torch.autograd.grad(fused.loss, list(model.parameters()))
    reference = F.cross_entropy(full.logits[:, :-1].reshape(-1, 300), labels[:, 1:].reshape(-1))
    torch.testing.assert_close(full.loss, reference)
    torch.testing.assert_close(fused.loss, full.loss, rtol=1e-6, atol=1e-6)
    for got, want in zip(fused_grads, full_grads, strict=True):
        torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-6)


def test_under_bf16_autocast_the_softmax_statistics_are_fp32() -> None:
    """The logits are the autocast (bf16) matmul's, the loss and softmax over them fp32."""
    torch.manual_seed(2)
    hidden = torch.randn(300, 16, requires_grad=True)
    weight = torch.randn(9000, 16, requires_grad=True)
    targets = torch.randint(0, 9000, (300,))
    targets[::5] = IGNORE_INDEX
    with torch.autocast("cpu", dtype=torch.bfloat16):
        loss = linear_cross_entropy(hidden, weight, targets)
        expected = F.cross_entropy((hidden @ weight.t()).float(), targets, ignore_index=IGNORE_INDEX)
    assert loss.dtype == torch.float32
    torch.testing.assert_close(loss, expected, rtol=1e-6, atol=1e-6)
    grads = torch.autograd.grad(loss, (hidden, weight))
    expected_grads = torch.autograd.grad(expected, (hidden, weight))
    for got, want in zip(grads, expected_grads, strict=True):
        assert got.dtype == torch.float32
        torch.testing.assert_close(got, want, rtol=2e-2, atol=1e-4)  # bf16 matmuls on both sides


@pytest.fixture
def no_backend_env(monkeypatch: pytest.MonkeyPatch) -> pytest.MonkeyPatch:
    monkeypatch.delenv(BACKEND_ENV, raising=False)
    return monkeypatch


def test_auto_is_chunked_on_cpu(no_backend_env: pytest.MonkeyPatch) -> None:
    assert loss_backend("cpu") == "chunked"
    no_backend_env.setenv(BACKEND_ENV, "auto")
    assert loss_backend(torch.device("cpu")) == "chunked"
    no_backend_env.setenv(BACKEND_ENV, "chunked")
    assert loss_backend("cpu") == "chunked"


def test_auto_is_liger_on_cuda_only_where_it_imports_and_not_compiled(no_backend_env: pytest.MonkeyPatch) -> None:
    no_backend_env.setattr(loss_module, "_liger_function", lambda: None)
    assert loss_backend("cuda") == "chunked"
    no_backend_env.setattr(loss_module, "_liger_function", lambda: F.cross_entropy)
    assert loss_backend("cuda") == "liger"
    assert loss_backend("cpu") == "chunked"
    no_backend_env.setattr(torch.compiler, "is_compiling", lambda: True)
    assert loss_backend("cuda") == "chunked"
    assert loss_backend("cuda", "liger") == "liger"  # explicit wins


def test_an_unknown_backend_is_a_one_line_error(no_backend_env: pytest.MonkeyPatch) -> None:
    no_backend_env.setenv(BACKEND_ENV, "fast")
    with pytest.raises(ConfigError, match=r"MESH_LOSS_BACKEND='fast' is invalid: one of auto, chunked, liger") as err:
        linear_cross_entropy(torch.randn(4, 2), torch.randn(5, 2), torch.zeros(4, dtype=torch.long))
    assert "\n" not in str(err.value)
    with pytest.raises(ConfigError, match=r"backend='Liger' is invalid"):
        loss_backend("cpu", "Liger")


def test_liger_without_cuda_is_a_clear_error(no_backend_env: pytest.MonkeyPatch) -> None:
    no_backend_env.setattr(loss_module, "_liger_function", lambda: F.cross_entropy)  # installed or not
    with pytest.raises(ConfigError, match="liger runs on CUDA tensors only"):
        linear_cross_entropy(torch.randn(4, 2), torch.randn(5, 2), torch.zeros(4, dtype=torch.long), backend="liger")
    no_backend_env.setenv(BACKEND_ENV, "liger")
    with pytest.raises(ConfigError, match=r"MESH_LOSS_BACKEND='liger' is invalid: liger runs on CUDA"):
        loss_backend("cpu")


def test_liger_without_the_package_is_a_clear_error(no_backend_env: pytest.MonkeyPatch) -> None:
    no_backend_env.setitem(sys.modules, "liger_kernel", None)  # makes the import fail
    loss_module._liger_function.cache_clear()
    try:
        assert loss_module._liger_function() is None
        with pytest.raises(ConfigError, match="liger needs the liger-kernel package"):
            loss_backend("cuda", "liger")
        assert loss_backend("cuda") == "chunked"
    finally:
        loss_module._liger_function.cache_clear()


def test_liger_is_called_with_our_semantics(no_backend_env: pytest.MonkeyPatch) -> None:
    """Mean over non-ignored targets, ignore index -100, fp32 accumulation of the weight's gradient."""
    calls = []

    def fake_liger(hidden, weight, targets, **options):
        calls.append(options)
        return F.cross_entropy(hidden @ weight.t(), targets, ignore_index=options["ignore_index"])

    no_backend_env.setattr(loss_module, "_liger_function", lambda: fake_liger)
    hidden, weight = torch.randn(6, 3), torch.randn(7, 3)
    targets = torch.tensor([1, 2, IGNORE_INDEX, 4, 5, IGNORE_INDEX])
    got = loss_module._LOSSES["liger"](hidden, weight, targets)
    assert calls == [{"ignore_index": -100, "reduction": "mean", "accum_dtype": torch.float32}]
    torch.testing.assert_close(got, linear_cross_entropy(hidden, weight, targets, backend="chunked"))
