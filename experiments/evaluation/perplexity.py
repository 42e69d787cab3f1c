"""Perplexity on the run's validation sets: token-level mean NLL over non-overlapping windows.

The windows are the training validation's (``TokenWindows``): window ``i`` is
``tokens[i*L:(i+1)*L]`` and predicts its last ``L-1`` tokens, so on the same windows
``eval/loss/<set>`` equals the ``val/<set>/loss`` that ``mesh-train`` logs; here every window of
the split counts (or the first ``max_windows``), not only ``data.val_batches`` batches.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F


@torch.inference_mode()
def perplexity(
    model: torch.nn.Module,
    tokens: np.ndarray,
    seq_len: int,
    batch_size: int = 16,
    max_windows: int | None = None,
) -> dict[str, float] | None:
    """``{"loss", "ppl", "tokens", "windows"}`` of ``tokens`` cut into ``seq_len`` windows; None when
    the split is shorter than one window."""
    windows = len(tokens) // seq_len
    if max_windows is not None:
        windows = min(windows, max_windows)
    if windows == 0 or seq_len < 2:
        return None
    device = next(model.parameters()).device
    total, count = 0.0, 0
    for start in range(0, windows, batch_size):
        stop = min(windows, start + batch_size)
        chunk = np.asarray(tokens[start * seq_len : stop * seq_len], dtype=np.int64)
        ids = torch.from_numpy(chunk).view(stop - start, seq_len).to(device)
        logits = model(ids).logits.float()
        nll = F.cross_entropy(logits[:, :-1].reshape(-1, logits.shape[-1]), ids[:, 1:].reshape(-1), reduction="sum")
        total += float(nll.double())
        count += ids[:, 1:].numel()
    loss = total / count
    return {"loss": loss, "ppl": math.exp(min(loss, 50.0)), "tokens": count, "windows": windows}


def validation_perplexity(
    model: torch.nn.Module,
    prepared: Any,
    seq_len: int,
    batch_size: int = 16,
    max_windows: int | None = None,
) -> dict[str, dict[str, float]]:
    """Each validation set of ``prepared`` (``experiments.data.prepare``), named as training names
    it: the corpus's held-out split by the corpus, then each ``extra_val`` corpus."""
    results = {}
    for name, tokens in prepared.val.items():
        result = perplexity(model, tokens, seq_len, batch_size, max_windows)
        if result is not None:
            results[prepared.corpus if name == "val" else name] = result
    return results
