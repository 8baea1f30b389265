"""Conversion to / from transformers' AlbertForPreTraining: equal logits, exact round trip, clear refusals."""
import pytest
import torch

from albert_dist.model import AlbertConfig, AlbertForPreTraining
from albert_dist.model.hf import from_transformers, mismatched_layers, to_transformers

transformers = pytest.importorskip("transformers")

V, B, S = 120, 3, 10


def config(L, G, K, E=16, **kw) -> AlbertConfig:
    return AlbertConfig(vocab_size=V, embedding_size=E, hidden_size=32, num_hidden_layers=L,
                        num_hidden_groups=G, inner_group_num=K, num_attention_heads=4, intermediate_size=64,
                        max_position_embeddings=16, **kw)


def inputs():
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(0, V, (B, S), generator=g)
    mask = torch.ones(B, S, dtype=torch.long)
    mask[2, 6:] = 0
    types = torch.zeros(B, S, dtype=torch.long)
    types[:, 4:] = 1
    return ids, mask, types


@pytest.mark.parametrize("L, G, K, E", [(6, 2, 2, 16), (7, 3, 1, 16), (12, 1, 1, 16), (5, 5, 1, 32)])
def test_logits_equal_transformers_and_round_trip_is_exact(L, G, K, E):
    # HF's float group formula agrees with ours on these (L, G); E=32=H exercises the identity projection.
    assert mismatched_layers(L, G) == []
    torch.manual_seed(L)
    ours = AlbertForPreTraining(config(L, G, K, E)).eval()
    hf = to_transformers(ours).eval()
    ids, mask, types = inputs()
    with torch.no_grad():
        mlm, sop = ours.logits(ids, mask, types)
        ref = hf(input_ids=ids, attention_mask=mask, token_type_ids=types)
    real = mask.bool()  # transformers' logits at padded positions are defined too, compare everywhere
    torch.testing.assert_close(mlm[real], ref.prediction_logits[real], rtol=0, atol=1e-5)
    torch.testing.assert_close(mlm, ref.prediction_logits, rtol=0, atol=1e-5)
    torch.testing.assert_close(sop, ref.sop_logits, rtol=0, atol=1e-5)
    back = from_transformers(hf)
    assert back.config == ours.config
    a, b = ours.state_dict(), back.state_dict()
    assert a.keys() == b.keys()
    for k in a:
        assert torch.equal(a[k], b[k]), k


def test_from_transformers_of_a_fresh_hf_model():
    hf_config = transformers.AlbertConfig(vocab_size=V, embedding_size=16, hidden_size=32, num_hidden_layers=4,
                                          num_hidden_groups=2, inner_group_num=2, num_attention_heads=4,
                                          intermediate_size=64, max_position_embeddings=16)
    hf = transformers.AlbertForPreTraining(hf_config).eval()
    ours = from_transformers(hf).eval()
    ids, mask, types = inputs()
    with torch.no_grad():
        mlm, sop = ours.logits(ids, mask, types)
        ref = hf(input_ids=ids, attention_mask=mask, token_type_ids=types)
    torch.testing.assert_close(mlm, ref.prediction_logits, rtol=0, atol=1e-5)
    torch.testing.assert_close(sop, ref.sop_logits, rtol=0, atol=1e-5)


@pytest.mark.parametrize("sharing", ["attention", "ffn", "none"])
def test_partial_sharing_is_refused(sharing):
    with pytest.raises(ValueError, match="sharing"):
        to_transformers(AlbertForPreTraining(config(4, 2, 1, sharing=sharing)))


def test_group_formula_mismatch_is_refused():
    # transformers: int(9 / (18 / 14)) = 6; ours 9 * 14 // 18 = 7.
    assert mismatched_layers(18, 14) == [9]
    small = dict(vocab_size=V, embedding_size=8, hidden_size=8, num_attention_heads=2, intermediate_size=8,
                 max_position_embeddings=16)
    with pytest.raises(ValueError, match="num_hidden_groups=14"):
        to_transformers(AlbertForPreTraining(AlbertConfig(num_hidden_layers=18, num_hidden_groups=14, **small)))
    hf = transformers.AlbertForPreTraining(transformers.AlbertConfig(
        num_hidden_layers=18, num_hidden_groups=14, **small))
    with pytest.raises(ValueError, match="num_hidden_layers=18"):
        from_transformers(hf)


def test_non_identity_projection_is_refused_when_e_equals_h():
    hf_config = transformers.AlbertConfig(vocab_size=V, embedding_size=32, hidden_size=32, num_hidden_layers=2,
                                          num_attention_heads=4, intermediate_size=64, max_position_embeddings=16)
    with pytest.raises(ValueError, match="embedding_hidden_mapping_in"):
        from_transformers(transformers.AlbertForPreTraining(hf_config))
