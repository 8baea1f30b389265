"""The sharing plan: which parameter set every executed block (layer i, inner block j, sub-block) uses.

ALBERT (Lan et al. 2020, section 3.1 "cross-layer parameter sharing") splits the L = `num_hidden_layers`
layers into G = `num_hidden_groups` contiguous groups; each group holds K = `inner_group_num` blocks, and layer
i runs the K blocks of group `group_index(i, L, G)` in sequence, so the executed depth is L x K blocks
(executed block k = i * K + j). A block is two sub-blocks:

* attention: `query`, `key`, `value`, output `dense` and its `LayerNorm`      -> 4(H^2 + H) + 2H parameters
* feed-forward: `ffn` (H->I), `ffn_output` (I->H), `full_layer_layer_norm`    -> 2HI + I + H + 2H parameters

`sharing` decides which sub-blocks are shared per (group, inner index) and which every executed block owns
(ALBERT Table 4 studies all four):

=============  ================================  =====================================================
sharing        encoder block parameters          storage (module names)
=============  ================================  =====================================================
``all``        G*K*(attn + ffn)                  albert_layer_groups.{g}.albert_layers.{j}.{attention,ffn*}
``attention``  G*K*attn + L*K*ffn                albert_layer_groups.{g}.albert_layers.{j}.attention
                                                 + blocks.{k}.{ffn, ffn_output, full_layer_layer_norm}
``ffn``        G*K*ffn + L*K*attn                albert_layer_groups.{g}.albert_layers.{j}.{ffn*}
                                                 + blocks.{k}.attention
``none``       L*K*(attn + ffn)                  blocks.{k}.{attention, ffn*}
=============  ================================  =====================================================

(all names under ``albert.encoder.``; ``ffn*`` = ``ffn, ffn_output, full_layer_layer_norm``). With
``sharing="all"`` the names are exactly transformers' ``AlbertForPreTraining`` names, which makes
`albert_dist.model.hf` a rename-free conversion. The total parameter count adds, to the encoder blocks above,
embeddings (V + P + T)E + 2E, the projection EH + H (absent when E == H, as in the original ALBERT code),
the pooler H^2 + H, the MLM head HE + E + 2E + V (decoder tied to the word embeddings) and the SOP classifier
2H + 2 — see `parameter_count`.
"""
from __future__ import annotations

from albert_dist.model.config import AlbertConfig


def group_index(layer_idx: int, num_hidden_layers: int, num_hidden_groups: int) -> int:
    """Group of layer `layer_idx` (0-based): ``layer_idx * G // L``, in integer arithmetic.

    Groups are contiguous, every group is used, and group sizes differ by at most one (7 layers, 3 groups ->
    0,0,0,1,1,2,2). transformers computes ``int(i / (L / G))`` in floats, which disagrees for 49 pairs with
    L <= 64 (first: L=18, G=14, layer 9 -> 6 instead of 7); `albert_dist.model.hf` refuses those pairs.

    Raises `ValueError` when G is not in [1, L] or `layer_idx` is not in [0, L).
    """
    if not 1 <= num_hidden_groups <= num_hidden_layers:
        raise ValueError(f"num_hidden_groups must be in [1, num_hidden_layers={num_hidden_layers}], "
                         f"got {num_hidden_groups}")
    if not 0 <= layer_idx < num_hidden_layers:
        raise ValueError(f"layer_idx must be in [0, {num_hidden_layers}), got {layer_idx}")
    return layer_idx * num_hidden_groups // num_hidden_layers


def shares_attention(sharing: str) -> bool:
    """True when the attention sub-block is shared per (group, inner index)."""
    return sharing in ("all", "attention")


def shares_ffn(sharing: str) -> bool:
    """True when the feed-forward sub-block is shared per (group, inner index)."""
    return sharing in ("all", "ffn")


def executed_blocks(config: AlbertConfig) -> list[tuple[int, int, int]]:
    """The executed blocks in order, as ``(k, g, j)``: flat block index k = i*K + j, group g, inner index j."""
    K = config.inner_group_num
    return [(i * K + j, group_index(i, config.num_hidden_layers, config.num_hidden_groups), j)
            for i in range(config.num_hidden_layers) for j in range(K)]


#: Name prefix of the shared sub-blocks' parameters (transformers' AlbertModel layout).
SHARED_PREFIX = "albert.encoder.albert_layer_groups."


def shared_block_of(name: str) -> tuple[int, int, str] | None:
    """(group g, inner block j, rest) of a shared sub-block parameter
    ``albert.encoder.albert_layer_groups.{g}.albert_layers.{j}.<rest>``; None for any other parameter name."""
    if not name.startswith(SHARED_PREFIX):
        return None
    parts = name.split(".")
    return int(parts[3]), int(parts[5]), ".".join(parts[6:])


def block_parameter_counts(config: AlbertConfig) -> tuple[int, int]:
    """Parameters of one attention sub-block and of one feed-forward sub-block, ``(attn, ffn)``."""
    H, I = config.hidden_size, config.intermediate_size
    return 4 * (H * H + H) + 2 * H, (H * I + I) + (I * H + H) + 2 * H


def parameter_count(config: AlbertConfig) -> int:
    """Closed-form number of trainable parameters of `AlbertForPreTraining(config)` (tied decoder counted once).

    Encoder blocks per the table in the module docstring; the rest as listed there.
    """
    V, E, H = config.vocab_size, config.embedding_size, config.hidden_size
    L, G, K = config.num_hidden_layers, config.num_hidden_groups, config.inner_group_num
    attn, ffn = block_parameter_counts(config)
    n_attn = G * K if shares_attention(config.sharing) else L * K
    n_ffn = G * K if shares_ffn(config.sharing) else L * K
    embeddings = (V + config.max_position_embeddings + config.type_vocab_size) * E + 2 * E
    projection = E * H + H if E != H else 0
    heads = (H * H + H) + (H * E + E + 2 * E + V) + (2 * H + 2)
    return embeddings + projection + n_attn * attn + n_ffn * ffn + heads


def parameter_numels(config: AlbertConfig) -> list[int]:
    """Element count of every trainable tensor of `AlbertForPreTraining(config)`, the tied decoder once, in no
    particular order (torch-free): what decides which tensors ZeRO-3 keeps whole (DeepSpeed's
    `stage3_param_persistence_threshold` compares each tensor's numel) and the largest tensor.

    Sums to `parameter_count(config)`.
    """
    V, E, H, I = config.vocab_size, config.embedding_size, config.hidden_size, config.intermediate_size
    L, G, K = config.num_hidden_layers, config.num_hidden_groups, config.inner_group_num
    attention = [H * H, H] * 4 + [H, H]  # query, key, value, dense (weight, bias); LayerNorm
    ffn = [I * H, I, H * I, H, H, H]  # ffn, ffn_output (weight, bias); full_layer_layer_norm
    n_attn = G * K if shares_attention(config.sharing) else L * K
    n_ffn = G * K if shares_ffn(config.sharing) else L * K
    out = [V * E, config.max_position_embeddings * E, config.type_vocab_size * E, E, E]
    if E != H:
        out += [E * H, H]
    out += attention * n_attn + ffn * n_ffn
    out += [H * H, H]  # pooler
    out += [E * H, E, E, E, V]  # MLM head: dense, LayerNorm, bias (the decoder is the word embedding)
    out += [2 * H, 2]  # SOP classifier
    return out


def model_param_counts(model) -> dict[str, int]:
    """Parameter counts of an ``AlbertForPreTraining`` (logged as the run's ``derived.*`` params).

    Returns:
        ``unique_parameters``: stored, trainable elements (the tied decoder and every shared block counted
        once); ``total_parameters``: elements as executed, i.e. a shared block counted once per executed
        block that uses it (what an unshared BERT of the same depth would hold; same rule as
        `albert_dist.model.unroll.unroll`); ``group_<g>_parameters``: elements of each shared group.
    """
    uses: dict[tuple[int, int], int] = {}
    for _, g, j in executed_blocks(model.config):
        uses[(g, j)] = uses.get((g, j), 0) + 1
    counts = {"unique_parameters": 0, "total_parameters": 0}
    for name, p in model.named_parameters():  # named_parameters() yields a tied/shared tensor once
        if not p.requires_grad:
            continue
        n = getattr(p, "ds_numel", None) or p.numel()  # ZeRO-3 leaves a partitioned param empty
        counts["unique_parameters"] += n
        shared = shared_block_of(name)
        if shared is not None:
            g, j, _ = shared
            counts[f"group_{g}_parameters"] = counts.get(f"group_{g}_parameters", 0) + n
            counts["total_parameters"] += n * uses.get((g, j), 0)
        else:
            counts["total_parameters"] += n
    return counts
