"""The chunked linear cross-entropy equals the loss and gradients of the full logits."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from mesh_model import ModelConfig, build_model
from mesh_model.loss import IGNORE_INDEX, chunk_rows, linear_cross_entropy, shifted_targets


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
