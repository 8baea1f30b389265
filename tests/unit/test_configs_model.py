"""Every model preset in configs/model loads strictly; typos and wrong types are errors."""
from pathlib import Path

import pytest

from albert_dist.config import load_model_config
from albert_dist.model import AlbertConfig

CONFIG_DIR = Path(__file__).resolve().parents[2] / "configs" / "model"
PRESETS = sorted(CONFIG_DIR.glob("*.yaml"))


def test_all_presets_present():
    names = {p.stem for p in PRESETS}
    assert {"albert-tiny", "albert-base", "albert-large", "albert-xlarge", "albert-xxlarge"} <= names


@pytest.mark.parametrize("path", PRESETS, ids=lambda p: p.stem)
def test_preset_loads(path):
    config = load_model_config(path)
    assert isinstance(config, AlbertConfig)
    assert config.num_hidden_groups <= config.num_hidden_layers


def test_official_v2_hyper_parameters():
    # (H, L, heads, I) of ALBERT v2 base/large/xlarge/xxlarge, Lan et al. 2020 Table 1 and the released configs.
    expected = {"albert-base": (768, 12, 12, 3072), "albert-large": (1024, 24, 16, 4096),
                "albert-xlarge": (2048, 24, 16, 8192), "albert-xxlarge": (4096, 12, 64, 16384)}
    for name, (H, L, heads, I) in expected.items():
        c = load_model_config(CONFIG_DIR / f"{name}.yaml")
        assert (c.hidden_size, c.num_hidden_layers, c.num_attention_heads, c.intermediate_size) == (H, L, heads, I)
        assert (c.vocab_size, c.embedding_size, c.num_hidden_groups, c.sharing) == (30000, 128, 1, "all")
        assert (c.hidden_dropout_prob, c.attention_probs_dropout_prob) == (0.0, 0.0)


def test_tiny_matches_bundled_tokenizer_vocab():
    assert load_model_config(CONFIG_DIR / "albert-tiny.yaml").vocab_size == 8000


def test_unknown_key_is_an_error(tmp_path):
    path = tmp_path / "typo.yaml"
    path.write_text("hidden_size: 768\nnum_hiden_layers: 12\n")
    with pytest.raises(ValueError, match="num_hiden_layers"):
        load_model_config(path)


def test_wrong_type_is_an_error(tmp_path):
    path = tmp_path / "type.yaml"
    path.write_text("hidden_size: big\n")
    with pytest.raises(ValueError, match="hidden_size"):
        load_model_config(path)


def test_invalid_value_is_an_error(tmp_path):
    path = tmp_path / "value.yaml"
    path.write_text("sharing: some\n")
    with pytest.raises(ValueError, match="sharing"):
        load_model_config(path)
