"""SDPA with the key mask every batch used to carry vs without a mask (what a batch without padding now gets).

`albert_dist.model.albert.AlbertAttention` calls ``torch.nn.functional.scaled_dot_product_attention``; a batch
whose host copy has no padding reaches the model without ``attention_mask`` (`albert_dist.data.pretraining.
drop_full_mask`), and attention then runs without a mask, the only form PyTorch's FlashAttention backend takes
on CUDA. This times, on CPU, forward and forward + backward of SDPA at ALBERT-base's attention shapes (12 heads
of 64) with the boolean (B, 1, 1, S) all-ones mask and without one, at S=128 (B=16) and S=512 (B=4), in fp32,
and the forward in bf16 too (CPU's bf16 backward is a slow reference path, 3x fp32's, nothing a run uses); the
variants take turns within a repeat. Process CPU time per call (`_common.cpu_seconds`: the best block of
``torch.utils.benchmark``), one thread. On CPU both forms run the same kernel (``cpu_kernels``: torch's CPU
flash-attention kernel takes a mask), so the ratio masked / unmasked is the mask's own cost there; on CUDA the
FlashAttention backend refuses any mask and a masked call runs the memory-efficient or math kernel instead,
which only a GPU can time.

How often the maskless form applies: ``unpadded`` counts the batches without padding among the first 100 of the
training loader over the bundled corpus (`DataConfig` defaults: WikiText-2, ALBERT's ``short_seq_prob`` 0.1) at
S=128 x 16 and S=512 x 32, and at S=128 with the quickstart recipe's ``short_seq_prob`` 0.

    python bench/attention_mask.py [--repeats 3]

``run(repeats=...)`` returns per-repeat lists for bench/run_all.py.
"""
from __future__ import annotations

import argparse

import torch
import torch.nn.functional as F

from _common import cpu_seconds, fmt_stats

HEADS, HEAD_DIM = 12, 64
SHAPES = {"s128": (16, 128), "s512": (4, 512)}  # (B, S): 2,048 positions each
DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16}


def _calls(batch: int, seq: int, dtype: torch.dtype) -> dict:
    """The timed calls of one cell: forward (and in fp32 forward + backward), with and without the mask."""
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(batch, HEADS, seq, HEAD_DIM, generator=g).to(dtype).requires_grad_() for _ in range(3))
    mask = torch.ones(batch, 1, 1, seq, dtype=torch.bool)
    grad = torch.randn(batch, HEADS, seq, HEAD_DIM, generator=g).to(dtype)

    def forward(m):
        with torch.no_grad():
            F.scaled_dot_product_attention(q, k, v, attn_mask=m)

    def train(m):
        out = F.scaled_dot_product_attention(q, k, v, attn_mask=m)
        torch.autograd.grad(out, (q, k, v), grad)

    calls = {"forward_masked": lambda: forward(mask), "forward_unmasked": lambda: forward(None)}
    if dtype == torch.float32:
        calls.update(train_masked=lambda: train(mask), train_unmasked=lambda: train(None))
    return calls


def cpu_kernels(masked: bool) -> list[str]:
    """The attention operators SDPA dispatches to on CPU, with or without the mask (torch's profiler)."""
    q = torch.randn(1, HEADS, 16, HEAD_DIM)
    with torch.profiler.profile() as prof:
        F.scaled_dot_product_attention(q, q, q, attn_mask=torch.ones(1, 1, 1, 16, dtype=torch.bool) if masked else None)
    return sorted({e.name for e in prof.events()
                   if "attention" in e.name and e.name != "aten::scaled_dot_product_attention"})


def unpadded(seq: int, batch: int, short_seq_prob: float = 0.1, batches: int = 100) -> dict:
    """Of the first `batches` training batches (rank 0 of 1, the bundled corpus): how many have no padding
    (they reach the model without a mask), and the share of full rows."""
    from albert_dist.data.config import DataConfig
    from albert_dist.data.loader import build_train_loader

    cfg = DataConfig(max_seq_length=seq, num_workers=0, short_seq_prob=short_seq_prob)
    it = iter(build_train_loader(cfg, batch, 0, 1))
    full_batches = full_rows = 0
    for _ in range(batches):
        full = next(it)["attention_mask"].all(dim=1)
        full_batches += bool(full.all())
        full_rows += int(full.sum())
    return {"batches": batches, "unpadded_batches": full_batches, "full_rows_share": full_rows / (batches * batch)}


def run(repeats: int = 3, min_run_time: float = 0.3) -> dict:
    """Per cell (shape x dtype): CPU seconds per call of each variant, per repeat, and the ratios masked /
    unmasked for the forward and for forward + backward."""
    torch.set_num_threads(1)
    out: dict = {}
    for shape, (batch, seq) in SHAPES.items():
        for dname, dtype in DTYPES.items():
            calls = _calls(batch, seq, dtype)
            times: dict = {name: [] for name in calls}
            for _ in range(repeats):
                for name, call in calls.items():
                    times[name].append(cpu_seconds(call, min_run_time=min_run_time))
            cell = {f"{name}_s": value for name, value in times.items()}
            for kind in sorted({name.split("_")[0] for name in calls}):
                cell[f"ratio_{kind}_masked_over_unmasked"] = [
                    m / u for m, u in zip(times[f"{kind}_masked"], times[f"{kind}_unmasked"])]
            out[f"{shape}_{dname}"] = cell
    out["unpadded"] = {"s128_b16": unpadded(128, 16), "s512_b32": unpadded(512, 32),
                       "s128_b16_short_seq_prob_0": unpadded(128, 16, short_seq_prob=0.0)}
    return {**out, "cpu_kernels": {"masked": cpu_kernels(True), "unmasked": cpu_kernels(False)}, "heads": HEADS,
            "head_dim": HEAD_DIM, "shapes": {k: list(v) for k, v in SHAPES.items()}}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    res = run(args.repeats)
    print(f"SDPA on CPU, 1 thread, {HEADS} heads x {HEAD_DIM}, all-ones (B,1,1,S) bool mask vs none; CPU ms per call "
          f"(min / median / max of {args.repeats} repeats); kernels: masked {res['cpu_kernels']['masked']}, unmasked "
          f"{res['cpu_kernels']['unmasked']}")
    for shape, (batch, seq) in SHAPES.items():
        for dname in DTYPES:
            cell = res[f"{shape}_{dname}"]
            for kind, label in (("forward", "forward"), ("train", "fwd+bwd")):
                if f"{kind}_masked_s" not in cell:
                    continue
                masked, unmasked = (fmt_stats(cell[f"{kind}_{v}_s"], 1e-3, 2) for v in ("masked", "unmasked"))
                print(f"  B={batch:2d} S={seq} {dname} {label:7s}: masked {masked}, unmasked {unmasked}; "
                      f"masked / unmasked {fmt_stats(cell[f'ratio_{kind}_masked_over_unmasked'])}")
    for name, u in res["unpadded"].items():
        print(f"  bundled corpus, {name}: {u['unpadded_batches']} of {u['batches']} batches without padding "
              f"(no mask); {u['full_rows_share']:.1%} of rows full")


if __name__ == "__main__":
    main()
