"""Parameter counts: transformers' AlbertForPreTraining (meta device), a closed form, ALBERT Table 4."""
from pathlib import Path

import pytest
import torch

from albert_dist.config import load_model_config
from albert_dist.model import AlbertConfig, AlbertForPreTraining

transformers = pytest.importorskip("transformers")

CONFIG_DIR = Path(__file__).resolve().parents[2] / "configs" / "model"
HF_FIELDS = ("vocab_size", "embedding_size", "hidden_size", "num_hidden_layers", "num_hidden_groups",
             "inner_group_num", "num_attention_heads", "intermediate_size", "max_position_embeddings",
             "type_vocab_size")


def n_params(model: torch.nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())  # tied parameters counted once


def ours(config: AlbertConfig) -> int:
    with torch.device("meta"):
        return n_params(AlbertForPreTraining(config))


def hf(config: AlbertConfig) -> int:
    hf_config = transformers.AlbertConfig(**{f: getattr(config, f) for f in HF_FIELDS})
    with torch.device("meta"):
        return n_params(transformers.AlbertForPreTraining(hf_config))


@pytest.mark.parametrize("name", ["albert-base", "albert-large", "albert-xlarge", "albert-xxlarge"])
def test_presets_equal_transformers(name):
    config = load_model_config(CONFIG_DIR / f"{name}.yaml")
    assert ours(config) == hf(config)


@pytest.mark.parametrize("L, G, K", [(12, 3, 1), (6, 2, 2), (7, 3, 2), (4, 4, 3)])
def test_all_sharing_equals_transformers(L, G, K):
    config = AlbertConfig(vocab_size=1000, embedding_size=32, hidden_size=64, num_attention_heads=4,
                          intermediate_size=256, num_hidden_layers=L, num_hidden_groups=G, inner_group_num=K)
    assert ours(config) == hf(config)


def closed_form(c: AlbertConfig) -> int:
    """Written from the sub-block sizes, independently of albert_dist.model.sharing."""
    V, E, H, I = c.vocab_size, c.embedding_size, c.hidden_size, c.intermediate_size
    linear = lambda n_in, n_out: n_in * n_out + n_out  # noqa: E731
    layer_norm = lambda n: 2 * n  # noqa: E731
    attention = 4 * linear(H, H) + layer_norm(H)
    feed_forward = linear(H, I) + linear(I, H) + layer_norm(H)
    shared_blocks = c.num_hidden_groups * c.inner_group_num
    executed_blocks = c.num_hidden_layers * c.inner_group_num
    copies = {"all": (shared_blocks, shared_blocks), "attention": (shared_blocks, executed_blocks),
              "ffn": (executed_blocks, shared_blocks), "none": (executed_blocks, executed_blocks)}[c.sharing]
    encoder = copies[0] * attention + copies[1] * feed_forward + (linear(E, H) if E != H else 0)
    embeddings = (V + c.max_position_embeddings + c.type_vocab_size) * E + layer_norm(E)
    pooler = linear(H, H)
    mlm = linear(H, E) + layer_norm(E) + V  # decoder weight tied to the word embeddings, own bias
    sop = linear(H, 2)
    return embeddings + encoder + pooler + mlm + sop


@pytest.mark.parametrize("sharing", ["all", "attention", "ffn", "none"])
@pytest.mark.parametrize("L, G, K, E", [(5, 2, 2, 32), (6, 3, 1, 64), (3, 1, 3, 16)])
def test_closed_form(sharing, L, G, K, E):
    config = AlbertConfig(vocab_size=500, embedding_size=E, hidden_size=64, num_attention_heads=4,
                          intermediate_size=128, num_hidden_layers=L, num_hidden_groups=G, inner_group_num=K,
                          sharing=sharing)
    assert ours(config) == closed_form(config)


# ALBERT paper Table 4 (ALBERT-base, L=12, G=1, H=768, FFN 3072, V=30000), in millions of parameters.
TABLE_4 = {128: {"all": 12, "attention": 64, "ffn": 38, "none": 89},
           768: {"all": 31, "attention": 83, "ffn": 57, "none": 108}}


@pytest.mark.parametrize("E", [128, 768])
@pytest.mark.parametrize("sharing", ["all", "attention", "ffn", "none"])
def test_table_4_within_3_percent(E, sharing):
    config = AlbertConfig(embedding_size=E, sharing=sharing)
    count = ours(config)
    assert abs(count / 1e6 - TABLE_4[E][sharing]) / TABLE_4[E][sharing] < 0.03, count
