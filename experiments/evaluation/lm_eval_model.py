"""Our model as an lm-evaluation-harness model: ``MeshLM``, registered as ``mesh``.

Every request is scored on windows of at most the model's context (``max_seq_len``): a window is
a token list and the number of its last tokens to score (each predicted from everything before
it in the window). A continuation that fits is one window with the context truncated from the
left; ``loglikelihood_rolling`` (and a continuation longer than the context) uses lm-eval's
rolling windows (``get_rolling_token_windows`` + ``make_disjoint_window``), so every token is
predicted once with as much context as fits. Windows are sorted by length, right-padded and
scored one forward pass per batch; the model is causal, so padding on the right changes nothing
before it. ``generate_until`` decodes greedily, recomputing the last ``max_seq_len`` tokens for
each new token (no KV cache).

    lm = MeshLM.from_checkpoint("runs/mesh/<run>/checkpoints/last.ckpt", batch_size=16)
    lm = MeshLM(model, tokenizer)                       # a MeshTransformer and a TextTokenizer
    lm_eval.simple_evaluate(model=lm, tasks=[...])
    # once this module is imported: simple_evaluate(model="mesh", model_args={"checkpoint": ...}, ...)
"""

from __future__ import annotations

import logging
import os
from collections.abc import Iterator
from typing import Any

import torch
import torch.nn.functional as F
from lm_eval.api.model import TemplateLM
from lm_eval.api.registry import register_model
from lm_eval.utils import get_rolling_token_windows, make_disjoint_window

log = logging.getLogger(__name__)

Window = tuple[list[int], int]  # (tokens, how many of the last tokens to score)
AUTO_BATCH_SIZE = 16


def resolve_device(device: str | torch.device | None) -> torch.device:
    """``None``/``auto``: cuda when present, else cpu. A cuda device without CUDA falls back to cpu
    (lm-eval's CLI asks for cuda by default)."""
    if device is None or str(device) == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    device = torch.device(device)
    if device.type == "cuda" and not torch.cuda.is_available():
        log.warning("device=%s requested but CUDA is not available; using cpu", device)
        return torch.device("cpu")
    return device


def parse_batch_size(value: int | str | None) -> int:
    """lm-eval passes batch sizes as strings ("8", "auto", "auto:4"); auto means a fixed 16 here."""
    if value is None or value == "":
        return 1
    if isinstance(value, str) and value.startswith("auto"):
        return AUTO_BATCH_SIZE
    size = int(value)
    if size < 1:
        raise ValueError(f"batch_size={value!r} is invalid: must be >= 1")
    return size


def rolling_windows(tokens: list[int], prefix_token: int, max_length: int) -> list[Window]:
    """lm-eval's disjoint rolling windows over ``tokens``: each token is scored exactly once."""
    windows = get_rolling_token_windows(
        token_list=tokens, prefix_token=prefix_token, max_seq_len=max_length, context_len=1
    )
    return [(context + target, len(target)) for context, target in map(make_disjoint_window, windows)]


def continuation_windows(context: list[int], continuation: list[int], max_length: int) -> list[Window]:
    """Windows that score ``continuation`` after ``context`` (which must not be empty)."""
    sequence = context + continuation
    if len(continuation) <= max_length:  # the usual case: left-truncate the context
        return [(sequence[-(max_length + 1) :], len(continuation))]
    # Longer than the model's context: roll over the whole sequence, keep the continuation's part.
    windows, predicted = [], 1  # sequence[predicted:] are still to be predicted
    for tokens, n in rolling_windows(sequence[1:], sequence[0], max_length):
        predicted += n
        scored = min(n, predicted - len(context))
        if scored > 0:
            windows.append((tokens, scored))
    return windows


@register_model("mesh")
class MeshLM(TemplateLM):
    """A ``MeshTransformer`` + ``TextTokenizer`` for lm-eval (greedy, single process).

    ``checkpoint`` (a mesh-train checkpoint or run directory) loads both, the tokenizer from the
    run's ``config.yaml``; or pass ``model`` and ``tokenizer``. ``max_length`` defaults to the
    model's ``max_seq_len``; ``max_gen_toks`` caps generation when a task does not say.
    """

    def __init__(
        self,
        model: torch.nn.Module | None = None,
        tokenizer: Any = None,
        checkpoint: str | None = None,
        device: str | torch.device | None = None,
        batch_size: int | str | None = 1,
        max_batch_size: int | None = None,
        max_length: int | str | None = None,
        max_gen_toks: int | str = 256,
    ) -> None:
        super().__init__()
        if checkpoint is not None:
            if model is not None:
                raise ValueError("pass either checkpoint or model, not both")
            from experiments.checkpoints import load_model, load_tokenizer_and_data, locate

            files = locate(checkpoint)
            model, _ = load_model(files.checkpoint)
            tokenizer = tokenizer or load_tokenizer_and_data(files.config).tokenizer
        if model is None or tokenizer is None:
            raise ValueError("MeshLM needs a checkpoint, or a model and a tokenizer")
        if device is None:
            device = next(model.parameters()).device
        self._device = resolve_device(device)
        self.model = model.to(self._device).eval()
        self.tokenizer = tokenizer
        self.batch_size = parse_batch_size(batch_size)
        if max_batch_size is not None:
            self.batch_size = min(self.batch_size, int(max_batch_size))
        self._max_length = int(max_length) if max_length is not None else model.config.max_seq_len
        if not 1 <= self._max_length <= model.config.max_seq_len:
            raise ValueError(
                f"max_length={max_length} is invalid: the model's max_seq_len is {model.config.max_seq_len}"
            )
        self.max_gen_toks = int(max_gen_toks)
        if tokenizer.vocab_size > model.config.vocab_size:
            raise ValueError(
                f"the tokenizer has {tokenizer.vocab_size} tokens, more than the model's vocab_size={model.config.vocab_size}"
            )
        self.checkpoint = str(checkpoint) if checkpoint else None

    @classmethod
    def from_checkpoint(
        cls, path: str | os.PathLike[str], device: str | torch.device | None = None, batch_size: int | str = 1, **kwargs
    ) -> MeshLM:
        return cls(checkpoint=str(path), device=device, batch_size=batch_size, **kwargs)

    # --- what lm-eval asks of a TemplateLM ------------------------------------------------------

    @property
    def eot_token_id(self) -> int:
        return self.tokenizer.eos_id

    @property
    def max_length(self) -> int:
        return self._max_length

    @property
    def tokenizer_name(self) -> str:
        return self.tokenizer.identity

    def tok_encode(self, string: str, add_special_tokens: bool | None = None, **kwargs) -> list[int]:
        return self.tokenizer.encode(string)

    def tok_decode(self, tokens: list[int]) -> str:
        return self.tokenizer.decode(tokens)

    def get_model_info(self) -> dict[str, Any]:
        config = self.model.config
        return {
            "checkpoint": self.checkpoint,
            "preset": config.preset,
            "layout": config.layout,
            "scheme": config.scheme,
            "max_length": self.max_length,
            "tokenizer": self.tokenizer.identity,
        }

    def _loglikelihood_tokens(self, requests, disable_tqdm: bool = False, **kwargs) -> list[tuple[float, bool]]:
        per_request = [
            continuation_windows(context, continuation, self.max_length) for _, context, continuation in requests
        ]
        scores = iter(self.score_windows([w for windows in per_request for w in windows]))
        results = []
        for (key, _, _), windows in zip(requests, per_request, strict=True):
            parts = [next(scores) for _ in windows]
            result = (sum(p[0] for p in parts), all(p[1] for p in parts))
            results.append(result)
            if key is not None:
                self.cache_hook.add_partial("loglikelihood", key, result)
        return results

    def loglikelihood_rolling(self, requests, disable_tqdm: bool = False) -> list[float]:
        per_request = [
            rolling_windows(self.tok_encode(request.args[0]), self.prefix_token_id, self.max_length)
            for request in requests
        ]
        scores = iter(self.score_windows([w for windows in per_request for w in windows]))
        results = []
        for request, windows in zip(requests, per_request, strict=True):
            total = sum(next(scores)[0] for _ in windows)
            results.append(total)
            self.cache_hook.add_partial("loglikelihood_rolling", request.args, total)
        return results

    def generate_until(self, requests, disable_tqdm: bool = False) -> list[str]:
        jobs = []
        for request in requests:
            context, gen_kwargs = request.args
            jobs.append((self.tok_encode(context) or [self.prefix_token_id], *self._generation_settings(gen_kwargs)))
        order = sorted(range(len(jobs)), key=lambda i: -len(jobs[i][0]))
        results: list[str] = [""] * len(jobs)
        for batch in _chunks(order, self.batch_size):
            texts = self.greedy_generate(
                [jobs[i][0] for i in batch], [jobs[i][1] for i in batch], [jobs[i][2] for i in batch]
            )
            for i, text in zip(batch, texts, strict=True):
                results[i] = text
                self.cache_hook.add_partial("generate_until", requests[i].args, text)
        return results

    # --- the scoring and decoding themselves ----------------------------------------------------

    def _generation_settings(self, gen_kwargs: dict[str, Any]) -> tuple[list[str], int]:
        kwargs = dict(gen_kwargs or {})
        until = kwargs.pop("until", None) or []
        until = [until] if isinstance(until, str) else list(until)
        eos = self.tok_decode([self.eot_token_id])
        if eos not in until:
            until.append(eos)
        max_gen_toks = int(kwargs.pop("max_gen_toks", self.max_gen_toks))
        if kwargs.get("do_sample") or float(kwargs.get("temperature", 0.0) or 0.0) > 0:
            log.warning("generate_until: sampling was asked for (%s); MeshLM decodes greedily", kwargs)
        return until, max_gen_toks

    @torch.inference_mode()
    def _logits(self, sequences: list[list[int]]) -> torch.Tensor:
        """Logits (N, L, V) of right-padded ``sequences`` (each at most ``max_length`` long); the
        padding's own logits are garbage, every real position's are exact (the model is causal)."""
        width = max(len(s) for s in sequences)
        ids = torch.zeros(len(sequences), width, dtype=torch.long)
        for row, tokens in enumerate(sequences):
            ids[row, : len(tokens)] = torch.tensor(tokens, dtype=torch.long)
        return self.model(ids.to(self.device)).logits

    def score_windows(self, windows: list[Window]) -> list[tuple[float, bool]]:
        """Per window: (sum of log-probs of its last ``n`` tokens, whether each was the argmax)."""
        results: list[tuple[float, bool]] = [(0.0, True)] * len(windows)
        scored = [i for i, (_, n) in enumerate(windows) if n > 0]  # an empty continuation scores 0
        order = sorted(scored, key=lambda i: -len(windows[i][0]))
        for batch in _chunks(order, self.batch_size):
            logits = self._logits([windows[i][0][:-1] for i in batch])
            for row, i in enumerate(batch):
                tokens, n = windows[i]
                end = len(tokens) - 1  # positions 0..end-1 predict tokens 1..end
                logprobs = F.log_softmax(logits[row, end - n : end].float(), dim=-1)
                targets = torch.tensor(tokens[-n:], device=logprobs.device)
                picked = logprobs.gather(-1, targets[:, None]).squeeze(-1)
                greedy = bool((logprobs.argmax(-1) == targets).all())
                results[i] = (float(picked.double().sum()), greedy)
        return results

    def greedy_generate(self, contexts: list[list[int]], untils: list[list[str]], max_new: list[int]) -> list[str]:
        """Greedy continuations of ``contexts`` (a batch), each cut before its first stop string.

        Every step feeds the last ``max_length`` tokens of each row (the context truncated from the
        left as the generation grows) and appends the argmax; a row stops at EOS, at a stop string
        or after its ``max_new`` tokens.
        """
        generated: list[list[int]] = [[] for _ in contexts]
        active = [i for i in range(len(contexts)) if max_new[i] > 0]
        while active:
            sequences = [(contexts[i] + generated[i])[-self.max_length :] for i in active]
            logits = self._logits(sequences)
            last = torch.tensor([len(s) - 1 for s in sequences], device=logits.device)
            next_tokens = logits[torch.arange(len(active), device=logits.device), last].argmax(-1).tolist()
            still = []
            for i, token in zip(active, next_tokens, strict=True):
                if token == self.eot_token_id:
                    continue
                generated[i].append(token)
                text = self.tok_decode(generated[i])
                if len(generated[i]) < max_new[i] and not any(stop in text for stop in untils[i]):
                    still.append(i)
            active = still
        return [_cut(self.tok_decode(tokens), until) for tokens, until in zip(generated, untils, strict=True)]


def _cut(text: str, until: list[str]) -> str:
    """``text`` up to the earliest occurrence of any stop string."""
    ends = [text.find(stop) for stop in until if stop and stop in text]
    return text[: min(ends)] if ends else text


def _chunks(items: list[int], size: int) -> Iterator[list[int]]:
    for start in range(0, len(items), size):
        yield items[start : start + size]
