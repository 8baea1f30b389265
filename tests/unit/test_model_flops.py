"""Model FLOP counts against torch's own FLOP counter on a real forward pass."""
import pytest
import torch
from torch.nn.attention import SDPBackend, sdpa_kernel
from torch.utils.flop_counter import FlopCounterMode

from albert_dist.model import AlbertConfig, AlbertForPreTraining
from albert_dist.model.flops import forward_flops_per_token, training_flops_per_token


@pytest.mark.parametrize("E, L, G, K, sharing", [(16, 3, 1, 2, "all"), (32, 4, 2, 1, "none"), (32, 2, 2, 1, "ffn")])
def test_forward_flops_match_flop_counter(E, L, G, K, sharing):
    config = AlbertConfig(vocab_size=50, embedding_size=E, hidden_size=32, num_attention_heads=4,
                          intermediate_size=64, num_hidden_layers=L, num_hidden_groups=G, inner_group_num=K,
                          sharing=sharing, max_position_embeddings=16)
    encoder = AlbertForPreTraining(config).albert.encoder.eval()
    B, S = 2, 12
    x = torch.randn(B, S, E)
    mask = torch.ones(B, 1, 1, S, dtype=torch.bool)
    # The math backend runs attention as bmm's, which the counter sees (the CPU flash kernel it does not).
    with torch.no_grad(), sdpa_kernel(SDPBackend.MATH), FlopCounterMode(display=False) as counter:
        encoder(x, mask)
    assert forward_flops_per_token(config, S) * B * S == counter.get_total_flops()
    assert training_flops_per_token(config, S) == 3 * forward_flops_per_token(config, S)


def test_sharing_does_not_change_flops():
    counts = {s: training_flops_per_token(AlbertConfig(sharing=s, num_hidden_groups=3), 128)
              for s in ("all", "attention", "ffn", "none")}
    assert len(set(counts.values())) == 1


def test_rejects_bad_seq_len():
    with pytest.raises(ValueError, match="seq_len"):
        training_flops_per_token(AlbertConfig(), 0)
