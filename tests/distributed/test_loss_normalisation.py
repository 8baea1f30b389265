"""The step loss is per masked token (and per SOP sequence) of the global batch, whatever its layout.

Eight hand-made sequences whose masked-token counts range from 1 to 11 form one global batch. The same
optimiser step runs through the project's `albert_dist.engine.loss.optimizer_step` on a DeepSpeed engine
(ZeRO-2, fp32) in three layouts - gradient accumulation 4 x micro-batch 2 on one rank, GA 1 x micro-batch 8 on
one rank, GA 1 x micro-batch 4 on each of 2 ranks - and once as plain PyTorch: one forward over all eight
sequences, whose `loss` is exactly sum(CE over the masked tokens) / their count + the SOP mean, then
`clip_grad_norm_` and AdamW. The parameters after the step must agree to a scaled error of 1e-5, with
clipping off and (GA 4 and 2 ranks) with clipping on. A control shows that the batch discriminates: the old
mean-per-micro-batch loss at GA 4 x micro-batch 2 moves the parameters more than 100x that far from the
reference.
"""
from __future__ import annotations

import os

import pytest
import torch

from grad_matrix_worker import scaled_errors

from albert_dist.distributed.local_ranks import spawn_local_ranks

pytestmark = [pytest.mark.distributed, pytest.mark.timeout(600)]

SEQ_LEN = 16
SEED = 4321
TOL = 1e-5
#: Model as the gradient matrix's (tiny, shared, dropout 0); AdamW with eps=1 so an update is ~lr * gradient
#: (see tests/distributed/grad_matrix_worker.py), no warmup, one step.
OVERRIDES = [
    "model.vocab_size=61", "model.embedding_size=8", "model.hidden_size=16", "model.num_hidden_layers=3",
    "model.num_hidden_groups=1", "model.num_attention_heads=2", "model.intermediate_size=24",
    "model.max_position_embeddings=16", "model.hidden_dropout_prob=0.0", "model.attention_probs_dropout_prob=0.0",
    "optimizer.type=adamw", "optimizer.lr=1.0", "optimizer.eps=1.0", "optimizer.weight_decay=0.01",
    "optimizer.warmup_steps=0", "max_steps=1", "engine.zero_stage=2", f"seed={SEED}",
]
#: (name, world size, gradient accumulation, micro-batch, gradient clipping)
CASES = [("ga4_mb2", 1, 4, 2, 0.0), ("ga1_mb8", 1, 1, 8, 0.0), ("w2_mb4", 2, 1, 4, 0.0),
         ("ga4_mb2_clip", 1, 4, 2, 0.5), ("w2_mb4_clip", 2, 1, 4, 0.5)]
#: Masked tokens per sequence, ordered so that micro-batches of 2 (and of 4) hold very different counts.
MASKED = [11, 9, 1, 2, 7, 1, 3, 10]


def config(ga: int, micro: int, clip: float):
    from albert_dist.config import load_config

    return load_config(None, OVERRIDES + [f"engine.gradient_accumulation_steps={ga}",
                                          f"engine.train_micro_batch_size_per_gpu={micro}",
                                          f"engine.gradient_clipping={clip}"])


def global_batch() -> dict[str, torch.Tensor]:
    """8 sequences of various lengths with MASKED[i] labelled positions each; SOP labels, one ignored."""
    g = torch.Generator().manual_seed(SEED)
    n = len(MASKED)
    ids = torch.randint(5, 61, (n, SEQ_LEN), generator=g)
    lengths = torch.tensor([16, 14, 6, 8, 12, 5, 9, 15])
    mask = (torch.arange(SEQ_LEN)[None, :] < lengths[:, None]).long()
    types = (torch.arange(SEQ_LEN)[None, :] >= (lengths[:, None] // 2)).long() * mask
    mlm = torch.full((n, SEQ_LEN), -100)
    for i, k in enumerate(MASKED):
        positions = 1 + torch.randperm(int(lengths[i]) - 1, generator=g)[:k]
        mlm[i, positions] = torch.randint(0, 61, (k,), generator=g)
    sop = torch.randint(0, 2, (n,), generator=g)
    sop[5] = -100
    return {"input_ids": ids * mask, "attention_mask": mask, "token_type_ids": types, "mlm_labels": mlm,
            "sop_labels": sop}


def rank_batches(batch: dict[str, torch.Tensor], rank: int, world: int, ga: int, micro: int) -> list[dict]:
    """This rank's micro-batches: micro-step m of rank r holds sequences [(m * world + r) * micro, + micro)."""
    out = []
    for m in range(ga):
        start = (m * world + rank) * micro
        out.append({k: v[start:start + micro] for k, v in batch.items()})
    return out


def initial_model(cfg):
    from albert_dist.model import AlbertForPreTraining

    torch.manual_seed(SEED)
    return AlbertForPreTraining(cfg.model)


def reference(clip: float, per_micro_batch_mean_of: int = 0) -> dict[str, torch.Tensor]:
    """Plain PyTorch: one forward over the whole global batch (its loss is per token by construction), or the
    mean of `per_micro_batch_mean_of` micro-batches' own means (the old normalisation; the control)."""
    from albert_dist.engine.optim import build_optimizer

    cfg = config(1, 8, clip)
    model = initial_model(cfg)
    optimizer = build_optimizer(model, cfg.optimizer).optimizer
    batch = global_batch()
    if per_micro_batch_mean_of:
        parts = rank_batches(batch, 0, 1, per_micro_batch_mean_of, 8 // per_micro_batch_mean_of)
        loss = torch.stack([model(**b).loss for b in parts]).mean()
    else:
        loss = model(**batch).loss
    loss.backward()
    if clip > 0:
        torch.nn.utils.clip_grad_norm_(model.parameters(), clip)
    optimizer.step()
    return {n: p.detach().clone() for n, p in model.named_parameters()}


def _worker(rank: int, world: int, cases: list, out_dir: str) -> None:
    import deepspeed

    from albert_dist.engine.deepspeed_config import build_deepspeed_config
    from albert_dist.distributed.group import init_distributed
    from albert_dist.engine.loss import optimizer_step
    from albert_dist.engine.optim import build_optimizer

    init_distributed(timeout_s=120)
    for name, _, ga, micro, clip in cases:
        cfg = config(ga, micro, clip)
        model = initial_model(cfg)
        optimizer, after_initialize = build_optimizer(model, cfg.optimizer)
        engine, *_ = deepspeed.initialize(model=model, optimizer=optimizer,
                                          config=build_deepspeed_config(cfg.engine, world))
        after_initialize(engine)
        outputs = optimizer_step(engine, rank_batches(global_batch(), rank, world, ga, micro)).outputs
        if rank == 0:
            torch.save({"params": {n: p.detach().clone() for n, p in engine.module.named_parameters()},
                        "mlm_count": sum(int(o.mlm_count) for o in outputs)}, os.path.join(out_dir, f"{name}.pt"))
        engine.destroy()
    torch.distributed.barrier()
    torch.distributed.destroy_process_group()


@pytest.fixture(scope="module")
def results(tmp_path_factory) -> dict[str, dict]:
    out = tmp_path_factory.mktemp("loss_norm")
    for world in (1, 2):
        cases = [c for c in CASES if c[1] == world]
        spawn_local_ranks(_worker, world, world, cases, str(out))
    return {name: torch.load(out / f"{name}.pt") for name, *_ in CASES}


def scaled_error(got: dict[str, torch.Tensor], expected: dict[str, torch.Tensor]) -> tuple[float, str]:
    """Worst tensor's max |got - expected| / max |expected|, the gradient matrix's measure (with its floor of
    1e-3 x the largest tensor: the attention key bias has a zero gradient in exact arithmetic, its update is
    rounding noise)."""
    errors = scaled_errors(got, expected)
    name = max(errors, key=errors.get)
    return errors[name], name


def test_batch_has_uneven_masked_counts():
    batch = global_batch()
    assert ((batch["mlm_labels"] != -100).sum(1)).tolist() == MASKED


@pytest.mark.parametrize("case", CASES, ids=lambda c: c[0])
def test_step_equals_per_token_reference(results, case):
    name, _, _, _, clip = case
    error, tensor = scaled_error(results[name]["params"], reference(clip))
    assert error <= TOL, f"{name}: parameters {error:.3g} off the per-token reference at {tensor}"


def test_layout_counts_every_masked_token_once(results):
    for name, world, *_ in CASES:
        if world == 1:
            assert results[name]["mlm_count"] == sum(MASKED)


def test_control_mean_per_micro_batch_differs():
    error, _ = scaled_error(reference(0.0, per_micro_batch_mean_of=4), reference(0.0))
    assert error > 100 * TOL, error
