"""Model FLOP counts against torch's own FLOP counter on a real forward pass."""
import pytest
import torch
from torch.nn.attention import SDPBackend, sdpa_kernel
from torch.utils.flop_counter import FlopCounterMode

from albert_dist.model import AlbertConfig, AlbertForPreTraining
from albert_dist.model.flops import (forward_flops_per_token, pretraining_flops_per_sequence,
                                     training_flops_per_token)


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


@pytest.mark.parametrize("E, P, sharing", [(16, 4, "all"), (32, 20, "none")])
def test_pretraining_flops_count_what_the_model_computes(E, P, sharing):
    """The last block runs queries and feed-forward on the N = min(P + 1, S) gathered slots only, the MLM head on
    those slots; forward + backward is 3 x forward (torch's counter on the math attention backend)."""
    config = AlbertConfig(vocab_size=50, embedding_size=E, hidden_size=32, num_attention_heads=4,
                          intermediate_size=64, num_hidden_layers=3, num_hidden_groups=1, sharing=sharing,
                          max_position_embeddings=16)
    torch.manual_seed(0)
    model = AlbertForPreTraining(config, max_predictions_per_seq=P).eval()
    B, S = 2, 12
    ids = torch.randint(5, 50, (B, S))
    labels = torch.full((B, S), -100)
    labels[:, 2:5] = ids[:, 2:5]
    batch = dict(input_ids=ids, attention_mask=torch.ones(B, S, dtype=torch.long),
                 token_type_ids=torch.zeros(B, S, dtype=torch.long), mlm_labels=labels, sop_labels=torch.zeros(B, dtype=torch.long))
    with torch.no_grad(), sdpa_kernel(SDPBackend.MATH), FlopCounterMode(display=False) as forward:
        model(**batch)
    with sdpa_kernel(SDPBackend.MATH), FlopCounterMode(display=False) as step:
        model(**batch).loss.backward()
    assert pretraining_flops_per_sequence(config, S, P, training=False) * B == forward.get_total_flops()
    assert pretraining_flops_per_sequence(config, S, P) * B == step.get_total_flops()
    # every position through every block and the head, + pooler and SOP: what P + 1 >= S runs, and more than P = 4
    dense = forward_flops_per_token(config, S) * S + S * (2 * 32 * E + 2 * E * 50) + 2 * 32 * 32 + 4 * 32
    assert (pretraining_flops_per_sequence(config, S, P, training=False) == dense) == (P + 1 >= S)
    with pytest.raises(ValueError, match="max_predictions_per_seq"):
        pretraining_flops_per_sequence(config, S, 0)


def test_sharing_does_not_change_flops():
    counts = {s: training_flops_per_token(AlbertConfig(sharing=s, num_hidden_groups=3), 128)
              for s in ("all", "attention", "ffn", "none")}
    assert len(set(counts.values())) == 1


def test_rejects_bad_seq_len():
    with pytest.raises(ValueError, match="seq_len"):
        training_flops_per_token(AlbertConfig(), 0)
