"""A mistyped name answers with the closest known ones first, then the full list."""

import pytest

from experiments.overrides import OverrideError, check_overrides
from mesh_model import ConfigError, ModelConfig, SchemeSpec, did_you_mean


@pytest.mark.parametrize(
    ("value", "known", "expected"),
    [
        ("max_step", ["max_steps", "model", "seed"], "did you mean 'max_steps'? "),
        ("mesh2", ["base", "mesh", "static"], "did you mean 'mesh'? "),
        ("tiniest", ["tiny", "mini", "tiny-moe", "small"], "did you mean 'tiny' or 'tiny-moe'? "),  # shared prefix
        ("nosuch", ["schemes", "nonshared", "loops"], ""),  # nothing close: no guess
        ("ab", ["abc", "xyz"], "did you mean 'abc'? "),
        ("", ["abc"], ""),
    ],
)
def test_did_you_mean_picks_the_close_names_or_none(value, known, expected):
    assert did_you_mean(value, known) == expected


def test_the_model_the_schemes_and_the_run_keys_suggest():
    with pytest.raises(
        ConfigError, match=r"^scheme='ancor' is invalid: did you mean 'anchor' or 'anchor\*' or 'anchor_emb'\? use base"
    ):
        SchemeSpec.parse("ancor")
    with pytest.raises(ConfigError, match=r"^scheme='residual\+ancor' is invalid: did you mean 'residual\+anchor' or "):
        SchemeSpec.parse("residual+ancor")
    with pytest.raises(ConfigError, match=r"^preset='mini_moe' is invalid: did you mean 'mini-moe'"):
        ModelConfig.from_preset("mini_moe")
    with pytest.raises(
        OverrideError, match=r"^'val_evry' is not a config key; did you mean 'val_every' or 'log_every'\? known keys: "
    ):
        check_overrides(["val_evry=10"])
    with pytest.raises(
        OverrideError, match=r"^'optim.weight_decy' is not a config key under 'optim'; did you mean 'weight_decay'\?"
    ):
        check_overrides(["optim.weight_decy=0.1"])
    with pytest.raises(OverrideError, match=r"^trainer='gpus' is invalid: did you mean 'gpu'\? known options: "):
        check_overrides(["trainer=gpus"])
