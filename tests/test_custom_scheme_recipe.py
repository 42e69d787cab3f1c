"""The "Add your own scheme" recipe of docs/model.md, proven with public APIs only: a new scheme is one
``StatePassing`` subclass (``begin``/``step``/``end``), and these are the checks to copy for it.

Here the scheme is attached to a built model by hand (``model.state_passing = ...``); once its
name is in ``mesh_model/scheme_names.py`` and ``build_state_passing`` returns it, build the model
with ``ModelConfig.from_preset("tiny", scheme="gated")`` instead and keep the same checks.
"""

import torch
from torch import nn

from mesh_model import ModelConfig, build_model, count_parameters
from mesh_model.layers import rotary_tables
from mesh_model.schemes import LoopState, StatePassing

LAYOUT = "1+2R3+1"


class GatedResidual(StatePassing):
    """h(t+1) = f(h(t)) + g_t h(t): one trainable gate per loop step, 0 at init (= base)."""

    def __init__(self, loops: int) -> None:
        super().__init__()
        self.gates = nn.Parameter(torch.zeros(loops))

    def reset_parameters(self, init=None) -> None:
        with torch.no_grad():
            self.gates.zero_()

    def step(self, t: int, core_out: torch.Tensor, state: LoopState) -> LoopState:
        state.h = core_out + self.gates[t] * state.h
        return state


def gated_model(seed: int = 0):
    torch.manual_seed(seed)
    model = build_model(ModelConfig.from_preset("tiny", layout=LAYOUT, scheme="base"))
    model.state_passing = GatedResidual(model.config.loops)
    return model


def handwritten(model, ids):
    """The same model's blocks with the recurrence written out."""
    rope = rotary_tables(ids.shape[1], model.config.rotary_dims, model.config.rotary_base, ids.device)
    h = model.prelude(model.embed_in(ids) * model.embedding_scale, rope)
    for t, index in enumerate(model.core_schedule):
        h = model.cores[index](h, rope) + model.state_passing.gates[t] * h
    return model.embed_out(model.final_layer_norm(model.coda(h, rope)))


def test_custom_scheme_computes_its_recurrence():
    model = gated_model().eval()
    with torch.no_grad():
        model.state_passing.gates.copy_(torch.tensor([0.5, -0.25, 1.0]))
    ids = torch.randint(0, model.config.vocab_size, (2, 12))
    with torch.no_grad():
        torch.testing.assert_close(model(ids).logits, handwritten(model, ids))


def test_custom_scheme_at_init_is_base():
    torch.manual_seed(0)
    base = build_model(ModelConfig.from_preset("tiny", layout=LAYOUT, scheme="base")).eval()
    gated = gated_model().eval()
    gated.load_state_dict(base.state_dict(), strict=False)
    ids = torch.randint(0, base.config.vocab_size, (2, 12))
    with torch.no_grad():
        torch.testing.assert_close(gated(ids).logits, base(ids).logits)


def test_custom_scheme_parameters_are_counted_and_trained():
    model = gated_model()
    assert count_parameters(model)["router"] == model.config.loops == 3
    ids = torch.randint(0, model.config.vocab_size, (2, 12))
    model(ids, labels=ids).loss.backward()
    assert model.state_passing.gates.grad is not None
    assert torch.count_nonzero(model.state_passing.gates.grad) == 3
