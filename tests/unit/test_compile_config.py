"""`engine.compile` settings: validated before any process group starts, and the static shapes they need."""
import pytest
import torch

from albert_dist.config import load_config
from albert_dist.engine.compile import compile_model, keep_hooks_out_of_graphs
from albert_dist.model import AlbertConfig, AlbertForPreTraining

RECIPE = "configs/pretrain/albert-tiny-wikitext.yaml"


def test_defaults_and_overrides():
    cfg = load_config(RECIPE, [])
    assert cfg.engine.compile is False and cfg.engine.compile_scope == "model"
    cfg = load_config(RECIPE, ["engine.compile=true", "engine.compile_scope=block", "engine.zero_stage=3"])
    assert cfg.engine.compile and cfg.engine.compile_scope == "block"


@pytest.mark.parametrize("overrides,words", [
    (["engine.compile=true", "engine.zero_stage=3"], ["engine.compile_scope=model", "zero_stage=3", "block"]),
    (["engine.compile_scope=layers"], ["engine.compile_scope", "layers"]),
])
def test_bad_settings_are_refused_naming_the_field(overrides, words):
    with pytest.raises(ValueError) as err:
        load_config(RECIPE, overrides)
    assert all(w in str(err.value) for w in words), str(err.value)


def test_the_model_scope_at_zero3_is_fine_while_compile_is_off():
    assert load_config(RECIPE, ["engine.zero_stage=3"]).engine.compile_scope == "model"


def test_compiling_needs_the_static_gather():
    config = AlbertConfig(vocab_size=50, embedding_size=8, hidden_size=16, num_hidden_layers=2,
                          num_attention_heads=2, intermediate_size=24, max_position_embeddings=12)
    with pytest.raises(ValueError, match="max_predictions_per_seq"):
        compile_model(AlbertForPreTraining(config), "block", backend="eager")
    with pytest.raises(ValueError, match="compile_scope"):
        compile_model(AlbertForPreTraining(config, max_predictions_per_seq=4), "layers", backend="eager")


def test_hooks_are_wrapped_once_and_still_run():
    model = torch.nn.Sequential(torch.nn.Linear(2, 2), torch.nn.Linear(2, 2))
    seen = []
    model[0].register_forward_pre_hook(lambda m, a: seen.append("pre"))
    model[1].register_forward_hook(lambda m, a, o: seen.append("post"))
    assert keep_hooks_out_of_graphs(model) == 2 and keep_hooks_out_of_graphs(model) == 0
    model(torch.zeros(1, 2))
    assert seen == ["pre", "post"]
