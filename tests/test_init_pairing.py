"""Pairing that pairs: at one seed, every tensor two variants share starts bit-identical."""

import pytest
import torch

from mesh_model import ModelConfig, build_model
from mesh_model.init import SeededInit, tensor_seed

SCHEMES = ["base", "residual", "anchor", "anchor_emb", "residual+anchor", "static", "dynamic", "mesh"]


def tiny(**overrides):
    return ModelConfig.from_preset("tiny", vocab_size=512, **overrides)


def shared(a: torch.nn.Module, b: torch.nn.Module) -> list[str]:
    """Names of the parameters both models have with the same shape, outside the scheme."""
    pa, pb = dict(a.named_parameters()), dict(b.named_parameters())
    return [n for n in pa if n in pb and not n.startswith("state_passing.") and pa[n].shape == pb[n].shape]


def equal_and_different(a, b) -> tuple[list[str], list[str]]:
    pa, pb = dict(a.named_parameters()), dict(b.named_parameters())
    names = shared(a, b)
    same = [n for n in names if torch.equal(pa[n], pb[n])]
    return same, [n for n in names if n not in same]


@pytest.mark.parametrize("scheme", SCHEMES[1:])
def test_every_scheme_shares_every_common_tensor_with_base_at_one_seed(scheme):
    base = build_model(tiny(scheme="base"), init_seed=7)
    other = build_model(tiny(scheme=scheme), init_seed=7)
    same, different = equal_and_different(base, other)
    assert different == []
    # Embeddings, 4 distinct blocks (each with its LayerNorms, attention, MLP), final norm, head.
    assert len(same) == len(list(base.parameters())) == 52


def test_buffer_length_and_a_global_seed_keep_the_pairing():
    three = build_model(tiny(scheme="mesh", buffer_slots=3), init_seed=3)
    six = build_model(tiny(scheme="mesh", buffer_slots=6), init_seed=3)
    assert equal_and_different(three, six)[1] == []
    # Without an explicit seed the stream seed is the global generator's first draw.
    torch.manual_seed(11)
    base = build_model(tiny(scheme="base"))
    torch.manual_seed(11)
    mesh = build_model(tiny(scheme="mesh"))
    assert equal_and_different(base, mesh)[1] == []
    assert base.seeded_init.seed == mesh.seeded_init.seed


def test_two_seeds_differ_in_every_random_tensor():
    a = build_model(tiny(scheme="mesh"), init_seed=0)
    b = build_model(tiny(scheme="mesh"), init_seed=1)
    pa, pb = dict(a.named_parameters()), dict(b.named_parameters())
    random = [n for n, p in pa.items() if p.dim() >= 2]  # weights; biases and norms are constants
    assert random and all(not torch.equal(pa[n], pb[n]) for n in random)
    # The scheme's own parameters are seeded too: the same seed gives the same routers.
    again = build_model(tiny(scheme="mesh"), init_seed=0)
    assert torch.equal(a.state_passing.write_routers[1].weight, again.state_passing.write_routers[1].weight)


def test_scheme_parameters_draw_from_streams_of_their_own():
    """MeSH's routers do not reuse a shared tensor's stream (they would be correlated with it)."""
    mesh = build_model(tiny(scheme="mesh"), init_seed=5)
    router = mesh.state_passing.write_routers[0].weight.flatten()
    for name, p in mesh.named_parameters():
        if not name.startswith("state_passing.") and p.dim() >= 2:
            head = p.flatten()[: router.numel()] / p.flatten()[: router.numel()].std()
            assert not torch.allclose(head, router / router.std())
    assert tensor_seed(5, "scheme/write_routers.0.weight") != tensor_seed(5, "block0.attention.dense.weight")


def test_moe_routers_and_experts_pair_between_schemes():
    base = build_model(ModelConfig.from_preset("tiny-moe", vocab_size=512, scheme="base"), init_seed=2)
    mesh = build_model(ModelConfig.from_preset("tiny-moe", vocab_size=512, scheme="mesh"), init_seed=2)
    same, different = equal_and_different(base, mesh)
    assert different == [] and len(same) == len(list(base.parameters()))
    assert base.prelude[0].mlp.router.weight.std() > 0  # the router and the stacked experts, seeded
    assert torch.equal(base.prelude[0].mlp.dense_h_to_4h.weight, mesh.prelude[0].mlp.dense_h_to_4h.weight)


def test_a_compute_matched_vanilla_starts_as_the_looped_models_distinct_blocks():
    """Vanilla 6 = 1+2R2+1's compute depth: its layers 0..3 start as prelude.0, cores.0.0,
    cores.0.1, coda.0 (the distinct blocks in build order), output projections included."""
    looped = build_model(tiny(scheme="mesh"), init_seed=4)
    vanilla = build_model(tiny(layout="6"), init_seed=4)
    distinct = [looped.prelude[0], looped.cores[0][0], looped.cores[0][1], looped.coda[0]]
    for i, block in enumerate(distinct):
        for (name, p), (_, q) in zip(block.named_parameters(), vanilla.prelude[i].named_parameters(), strict=True):
            assert torch.equal(p, q), (i, name)
    assert not torch.equal(vanilla.prelude[4].attention.dense.weight, vanilla.prelude[3].attention.dense.weight)
    assert torch.equal(looped.embed_in.weight, vanilla.embed_in.weight)
    assert torch.equal(looped.embed_out.weight, vanilla.embed_out.weight)


def test_the_init_keeps_its_distribution_and_is_device_independent_of_meta():
    model = build_model(tiny(layout="1+2R2+1", scheme="base", d_model=128), init_seed=9)
    std = model.config.init_std
    out_std = std / (2 * model.config.compute_depth) ** 0.5
    assert model.embed_in.weight.std().item() == pytest.approx(std, rel=0.02)
    assert model.prelude[0].attention.dense.weight.std().item() == pytest.approx(out_std, rel=0.05)
    assert model.prelude[0].attention.dense.bias.abs().max().item() == 0.0
    with torch.device("meta"):
        meta = build_model(tiny(scheme="mesh"), init_seed=9)
    assert meta.embed_in.weight.is_meta
    values = SeededInit(9).normal_(torch.empty(3, 4, dtype=torch.float64), 1.0, "x")
    assert torch.equal(values, SeededInit(9).normal_(torch.empty(3, 4, dtype=torch.float64), 1.0, "x"))


def test_a_runs_seed_fixes_the_shared_weights_of_its_module_whatever_the_scheme(tmp_path):
    """The training path: ``build_module`` seeds the model with the run's ``seed``, not with the
    global generator's state, so base and MeSH cells of one seed start from the same weights."""
    from experiments.compose import compose_config
    from experiments.identity import model_config_for
    from experiments.plan import plan_run
    from experiments.trainer import build_module

    def module(scheme: str, seed: int):
        plan = plan_run(compose_config([f"scheme={scheme}", f"seed={seed}", f"runs_dir={tmp_path}"]))
        torch.manual_seed(1000 + len(scheme))  # the global state differs: it must not matter
        return build_module(plan, model_config_for(plan.config, 2048), ["shakespeare"]).model

    base, mesh, other_seed = module("base", 3), module("mesh", 3), module("base", 4)
    assert equal_and_different(base, mesh)[1] == []
    assert not torch.equal(base.embed_in.weight, other_seed.embed_in.weight)
