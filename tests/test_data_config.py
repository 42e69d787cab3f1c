import pytest
from omegaconf import OmegaConf

from experiments.data import DataConfig, as_data_config
from mesh_model.errors import ConfigError


def test_defaults_are_valid():
    cfg = DataConfig()
    assert (cfg.corpus, cfg.tokenizer, cfg.bpe_vocab_size, cfg.seq_len, cfg.batch_size) == (
        "shakespeare",
        "bpe",
        2048,
        128,
        16,
    )
    assert cfg.extra_val == [] and cfg.val_fraction == 0.1 and cfg.cache_dir is None


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        (
            {"corpus": "shakspeare"},
            "data.corpus='shakspeare' is invalid: known corpora: shakespeare, kjv, docs, cpython, text, hf, indexed",
        ),
        ({"corpus": "text"}, "data.path=None is invalid: corpus=text needs data.path (a text file or folder)"),
        ({"corpus": "indexed"}, "data.path=None is invalid: corpus=indexed needs data.path (the .bin/.idx prefix)"),
        ({"seq_len": 0}, "data.seq_len=0 is invalid: must be a positive integer"),
        ({"batch_size": -2}, "data.batch_size=-2 is invalid: must be a positive integer"),
        ({"val_fraction": 0.0}, "data.val_fraction=0.0 is invalid: must be in (0, 1)"),
        ({"val_fraction": 1.0}, "data.val_fraction=1.0 is invalid: must be in (0, 1)"),
        (
            {"bpe_vocab_size": 100},
            "data.bpe_vocab_size=100 is invalid: must be at least 257 (256 bytes + <|endoftext|>)",
        ),
        (
            {"extra_val": ["shakespeare"]},
            "data.extra_val=['shakespeare'] is invalid: extra validation corpora are among shakespeare, kjv, docs, cpython, "
            "other than data.corpus",
        ),
    ],
)
def test_bad_fields_fail_with_one_line(changes, message):
    with pytest.raises(ValueError) as info:
        DataConfig(**changes).validate()
    assert isinstance(info.value, ConfigError)
    assert str(info.value) == message and "\n" not in message


def test_validate_catches_later_mutation():
    cfg = DataConfig()
    cfg.seq_len = 0
    with pytest.raises(ConfigError, match="data.seq_len=0"):
        cfg.validate()


def test_structured_config_round_trip():
    node = OmegaConf.structured(DataConfig)
    node.corpus = "kjv"
    node.extra_val = ["cpython"]
    cfg = as_data_config(node)
    assert isinstance(cfg, DataConfig) and cfg.corpus == "kjv" and cfg.extra_val == ["cpython"]
    assert OmegaConf.to_object(node) == cfg
    assert as_data_config({"corpus": "cpython", "seq_len": 64}).seq_len == 64


def test_unknown_mapping_keys_are_refused():
    with pytest.raises(ConfigError, match=r"^data='seqlen' is invalid: unknown field; known fields: corpus, path"):
        as_data_config({"seqlen": 64})
