import pytest

from mesh_model import PRESETS, ConfigError, ModelConfig, SchemeSpec


def test_from_preset_takes_shape_and_overrides():
    config = ModelConfig.from_preset("pythia-410m", scheme="mesh")
    assert (config.d_model, config.n_heads, config.vocab_size, config.layout) == (1024, 16, 50304, "4+8R2+4")
    assert config.head_dim == 64 and config.rotary_dims == 16 and config.rotary_base == 10000.0
    assert config.preset == "pythia-410m"


def test_buffer_slots_default_is_k_plus_3():
    assert ModelConfig.from_preset("tiny", layout="1+2R2+1", scheme="mesh").slots == 5
    assert ModelConfig.from_preset("tiny", layout="1+2R3+1", scheme="mesh").slots == 6
    assert ModelConfig.from_preset("tiny", layout="1+2+2+1", scheme="mesh").slots == 5
    assert ModelConfig.from_preset("tiny", scheme="mesh", buffer_slots=3).slots == 3
    assert ModelConfig.from_preset("tiny", scheme="base", buffer_slots=3).slots is None


def test_vanilla_is_compute_matched():
    vanilla = ModelConfig.from_preset("pythia-1.4b", layout="4+8R2+4", scheme="mesh").vanilla()
    assert vanilla.layout == "24" and vanilla.scheme == "base" and vanilla.d_model == 2048


@pytest.mark.parametrize(
    ("text", "kind", "canonical", "coefficients"),
    [
        ("base", "base", "base", {}),
        ("mesh", "mesh", "mesh", {}),
        ("static", "static", "static", {}),
        ("dynamic", "dynamic", "dynamic", {}),
        ("residual", "fixed", "residual", {"residual": 1.0}),
        ("anchor*", "fixed", "anchor_emb", {"anchor_emb": 1.0}),
        ("anchor+residual", "fixed", "residual+anchor", {"anchor": 1.0, "residual": 1.0}),
        (
            "residual+anchor+anchor_emb",
            "fixed",
            "residual+anchor+anchor_emb",
            {"residual": 1.0, "anchor": 1.0, "anchor_emb": 1.0},
        ),
        ("0.5*anchor+0.25*anchor_emb", "fixed", "0.5*anchor+0.25*anchor_emb", {"anchor": 0.5, "anchor_emb": 0.25}),
        ("0.9*core+anchor", "fixed", "0.9*core+anchor", {"core": 0.9, "anchor": 1.0}),
        ("core", "base", "base", {}),
    ],
)
def test_scheme_names_parse(text, kind, canonical, coefficients):
    spec = SchemeSpec.parse(text)
    assert spec.kind == kind
    assert spec.canonical == canonical
    assert spec.coefficients == coefficients


@pytest.mark.parametrize(
    ("kwargs", "start", "fragment"),
    [
        ({"scheme": "meshy"}, "scheme='meshy' is invalid", "use base, mesh, static, dynamic"),
        ({"scheme": "anchor+anchor"}, "scheme='anchor+anchor' is invalid", "residual, anchor, anchor_emb"),
        ({"buffer_slots": 0, "scheme": "mesh"}, "buffer_slots=0 is invalid", "at least 1 slot"),
        ({"buffer_slots": -2, "scheme": "mesh"}, "buffer_slots=-2 is invalid", "at least 1 slot"),
        ({"n_heads": 5}, "n_heads=5 is invalid", "must divide d_model=64"),
        ({"d_model": 0}, "d_model=0 is invalid", "positive integer"),
        ({"layout": "4+8R0+4"}, "layout='4+8R0+4' is invalid", "K>=1"),
        ({"layout": "24", "scheme": "mesh"}, "scheme='mesh' is invalid", "has no core"),
        ({"layout": "6", "scheme": "anchor"}, "scheme='anchor' is invalid", "4+8+8+4"),
    ],
)
def test_bad_config_fails_at_build_with_one_line(kwargs, start, fragment):
    with pytest.raises(ConfigError) as info:
        ModelConfig.from_preset("tiny", **kwargs)
    message = str(info.value)
    assert message.startswith(start) and fragment in message and "\n" not in message


def test_unknown_preset_lists_the_known_ones():
    with pytest.raises(ConfigError) as info:
        ModelConfig.from_preset("pythia-3b")
    message = str(info.value)
    assert message.startswith(
        "preset='pythia-3b' is invalid: did you mean 'pythia-1b' or 'pythia-6.9b' or 'pythia-2.8b'? "
    )
    assert "known presets: " in message
    for name in PRESETS:
        assert name in message


def test_unknown_field_lists_the_fields():
    with pytest.raises(
        ConfigError, match=r"ModelConfig field='bufer_slots' is invalid: known fields: layout, scheme, buffer_slots"
    ):
        ModelConfig.from_preset("tiny", bufer_slots=4)
