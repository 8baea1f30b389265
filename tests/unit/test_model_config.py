"""AlbertConfig validation and the integer layer -> group mapping."""
import dataclasses

import pytest

from albert_dist.model import AlbertConfig, group_index


@pytest.mark.parametrize("field, value", [
    ("num_hidden_groups", 0),
    ("num_hidden_groups", 13),  # G > L = 12
    ("inner_group_num", 0),
    ("num_attention_heads", 5),  # 768 % 5 != 0
    ("sharing", "layers"),
    ("hidden_act", "swishy"),
    ("hidden_dropout_prob", 1.0),
    ("hidden_dropout_prob", -0.1),
    ("attention_probs_dropout_prob", 1.5),
    ("vocab_size", 0),
    ("layer_norm_eps", 0.0),
])
def test_bad_config_raises_naming_field(field, value):
    with pytest.raises(ValueError, match=field) as info:
        AlbertConfig(**{field: value})
    assert repr(value) in str(info.value) or str(value) in str(info.value)


def test_valid_configs_do_not_raise_and_are_not_mutated():
    config = AlbertConfig(num_hidden_layers=7, num_hidden_groups=7, inner_group_num=3, sharing="ffn",
                          hidden_dropout_prob=0.1)
    assert dataclasses.asdict(config)["num_hidden_groups"] == 7
    assert config.num_executed_blocks == 21


def test_group_index_seven_layers_three_groups():
    assert [group_index(i, 7, 3) for i in range(7)] == [0, 0, 0, 1, 1, 2, 2]


def test_group_index_exhaustive():
    for L in range(1, 65):
        for G in range(1, L + 1):
            groups = [group_index(i, L, G) for i in range(L)]
            assert groups == sorted(groups), (L, G)  # contiguous, non-decreasing
            assert set(groups) == set(range(G)), (L, G)  # every group used
            sizes = [groups.count(g) for g in range(G)]
            assert max(sizes) - min(sizes) <= 1, (L, G, sizes)


@pytest.mark.parametrize("args", [(0, 4, 0), (0, 4, 5), (4, 4, 2), (-1, 4, 2)])
def test_group_index_rejects_bad_arguments(args):
    with pytest.raises(ValueError):
        group_index(*args)



def test_model_sources_import_no_distributed_stack():
    """No source of albert_dist.model imports deepspeed, mlflow or torch.distributed (what a fresh interpreter
    loads when importing the package: tests/integration/test_import_weight.py)."""
    import re
    from pathlib import Path

    import albert_dist.model as model_pkg
    forbidden = re.compile(r"^\s*(import|from)\s+(deepspeed|mlflow|torch\.distributed)\b", re.MULTILINE)
    for source in Path(model_pkg.__file__).parent.glob("*.py"):
        assert not forbidden.search(source.read_text()), source
