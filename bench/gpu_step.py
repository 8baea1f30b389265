"""ALBERT-base bf16 pretraining steps with DeepSpeed ZeRO-2 on one NVIDIA GPU, and a model-step comparison.

Run by bench/gpu_check.sh (which prepares the Python environment); not part of the CPU suite (it has no
``run`` function, so bench/run_all.py does not pick it up). For each sequence length (128 and 512):

1. ``engine``: configs/model/albert-base.yaml, ZeRO-2, bf16 with fp32 gradient accumulation, AdamW, through
   the project's own ``build_deepspeed_config`` / ``build_optimizer``; batches from the bundled WikiText-2
   sample via ``build_train_loader`` (prefetched to the GPU before timing, so the figure is the step, not the
   loader; the loader's own rate is printed beside it). Prints tokens/s (padded positions, the compute run)
   and non-padding tokens/s, MFU = training_flops_per_token(S) x positions/s / peak (the trainer's
   definition: executed blocks, forward + backward; the MLM head is not counted), peak allocated memory.
   The peak is the datasheet dense bf16 figure of the device (:data:`PEAK_BF16_TFLOPS`), else
   $ALBERT_DIST_PEAK_TFLOPS; a bf16 matmul measured in the same run is printed as well.
2. ``model step vs transformers``: plain PyTorch, no DeepSpeed, bf16 autocast over fp32 weights, fused AdamW,
   the same batches: albert_dist's AlbertForPreTraining vs transformers' (``attn_implementation="sdpa"``)
   with the same weights (``to_transformers``), alternating blocks of steps; ratio ours / transformers.

    python bench/gpu_step.py [--seqs 128 512] [--steps 30] [--out results.json]
    python bench/gpu_step.py --device cpu --model albert-tiny --seqs 64 --steps 2 --micro-batch 4  # smoke test
"""
from __future__ import annotations

import argparse
import json
import logging
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any, Optional

import torch

ROOT = Path(__file__).resolve().parents[1]
MODEL_DIR = ROOT / "configs" / "model"
#: Micro batch per sequence length: ~16k positions per step (ALBERT's batch 4096 x 512 is 2M positions per
#: step across many devices; this keeps one step short while the GPU stays busy).
MICRO_BATCH = {128: 128, 512: 32}

#: Dense bf16 tensor-core peak, TFLOP/s, by a substring of torch.cuda.get_device_name() (first match wins;
#: vendor datasheets, without sparsity).
PEAK_BF16_TFLOPS: tuple[tuple[str, float], ...] = (
    ("H100 PCIe", 756.0), ("H100 NVL", 835.0), ("GH200", 989.0), ("H200", 989.0), ("H100", 989.0),
    ("H800", 989.0), ("H20", 148.0), ("B200", 2250.0), ("B100", 1750.0), ("A100", 312.0), ("A800", 312.0),
    ("L40S", 362.0), ("L40", 181.0), ("L4", 121.0), ("A10", 125.0),
)
log = logging.getLogger("bench.gpu_step")


def datasheet_peak_tflops(device_name: str) -> Optional[float]:
    """Dense bf16 peak of a device by name (:data:`PEAK_BF16_TFLOPS`), else $ALBERT_DIST_PEAK_TFLOPS, else None."""
    for key, value in PEAK_BF16_TFLOPS:
        if key in device_name:
            return value
    env = os.environ.get("ALBERT_DIST_PEAK_TFLOPS")
    return float(env) if env else None


def _prefetch(seq: int, micro_batch: int, n: int, device: torch.device) -> tuple[list[dict], float]:
    """``n`` real batches at sequence length ``seq`` on ``device``, and the loader's tokens/s producing them."""
    from albert_dist.data.config import DataConfig
    from albert_dist.data.loader import build_train_loader

    cfg = DataConfig(max_seq_length=seq, num_workers=min(4, os.cpu_count() or 1))
    loader = build_train_loader(cfg, micro_batch, 0, 1)
    it = iter(loader)
    next(it)  # worker start-up is not part of the rate
    t0 = time.perf_counter()
    batches = [next(it) for _ in range(n)]
    rate = n * micro_batch * seq / (time.perf_counter() - t0)
    del it, loader
    return [{k: v.to(device, non_blocking=True) for k, v in b.items()} for b in batches], rate


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _time_steps(step, batches: list[dict], warmup: int, device: torch.device) -> list[float]:
    """Seconds per step for every batch after ``warmup`` ones (synchronised)."""
    out = []
    for i, batch in enumerate(batches):
        _sync(device)
        t0 = time.perf_counter()
        step(batch)
        _sync(device)
        if i >= warmup:
            out.append(time.perf_counter() - t0)
    return out


def engine_steps(model_name: str, seq: int, steps: int, warmup: int, device: torch.device,
                 peak: Optional[float], micro: Optional[int] = None) -> dict[str, Any]:
    """ZeRO-2 bf16 DeepSpeed steps of preset ``model_name`` at ``seq``: throughput, MFU, peak memory."""
    import deepspeed

    from albert_dist.config import TrainConfig
    from albert_dist.engine.deepspeed_config import build_deepspeed_config
    from albert_dist.engine.metrics import peak_memory_bytes
    from albert_dist.engine.optim import build_optimizer
    from albert_dist.config import load_model_config
    from albert_dist.model import AlbertForPreTraining
    from albert_dist.model.flops import training_flops_per_token

    micro = micro or MICRO_BATCH.get(seq, max(1, 16384 // seq))
    cfg = TrainConfig(model=load_model_config(MODEL_DIR / f"{model_name}.yaml"))
    cfg.engine.zero_stage, cfg.engine.precision, cfg.engine.grad_accum_dtype = 2, "bf16", "fp32"
    cfg.engine.train_micro_batch_size_per_gpu = micro
    batches, loader_tps = _prefetch(seq, micro, steps + warmup, device)
    torch.manual_seed(0)
    model = AlbertForPreTraining(cfg.model)
    engine, *_ = deepspeed.initialize(model=model, optimizer=build_optimizer(model, cfg.optimizer).optimizer,
                                      config=build_deepspeed_config(cfg.engine, world_size=1))
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
    losses = []

    def step(batch):
        loss = engine(**batch).loss
        engine.backward(loss)
        engine.step()
        losses.append(loss.detach())

    times = _time_steps(step, batches, warmup, device)
    positions = micro * seq
    real = [int(b["attention_mask"].sum()) for b in batches[warmup:]]
    tps = [positions / t for t in times]
    flops = training_flops_per_token(cfg.model, seq)
    out = {
        "seq": seq, "micro_batch": micro, "steps": len(times), "step_s": times,
        "tokens_per_s": tps, "non_pad_tokens_per_s": [r / t for r, t in zip(real, times)],
        "loader_tokens_per_s_prefetch": loader_tps,
        "peak_memory_gib": peak_memory_bytes(device) / 2**30,  # allocated on CUDA, RSS on CPU
        "loss_first": float(losses[0]), "loss_last": float(losses[-1]),
        "model_tflops_per_s": statistics.median(tps) * flops / 1e12,
    }
    if peak:
        out["mfu"] = [t * flops / (peak * 1e12) for t in tps]
    engine.destroy()
    del engine, model
    if device.type == "cuda":
        torch.cuda.empty_cache()
    return out


def model_step_vs_hf(model_name: str, seq: int, steps: int, warmup: int, device: torch.device,
                     micro: Optional[int] = None) -> dict[str, Any]:
    """Plain bf16-autocast training steps of ours vs transformers' ALBERT-base (same weights, same batches)."""
    from albert_dist.config import load_model_config
    from albert_dist.model import AlbertForPreTraining
    from albert_dist.model.hf import to_transformers

    micro = micro or MICRO_BATCH.get(seq, max(1, 16384 // seq))
    batches, _ = _prefetch(seq, micro, steps + warmup, device)
    torch.manual_seed(0)
    ours = AlbertForPreTraining(load_model_config(MODEL_DIR / f"{model_name}.yaml"))
    hf = to_transformers(ours)  # attn_implementation="sdpa"
    ours, hf = ours.to(device).train(), hf.to(device).train()
    fused = device.type == "cuda"
    opts = {"ours": torch.optim.AdamW(ours.parameters(), lr=1e-4, fused=fused),
            "hf": torch.optim.AdamW(hf.parameters(), lr=1e-4, fused=fused)}

    def make_step(name):
        model, opt = (ours, opts["ours"]) if name == "ours" else (hf, opts["hf"])

        def step(b):
            opt.zero_grad(set_to_none=True)
            with torch.autocast(device.type, dtype=torch.bfloat16):
                if name == "ours":
                    loss = model(**b).loss
                else:
                    loss = model(input_ids=b["input_ids"], attention_mask=b["attention_mask"],
                                 token_type_ids=b["token_type_ids"], labels=b["mlm_labels"],
                                 sentence_order_label=b["sop_labels"]).loss
            loss.backward()
            opt.step()
        return step

    times: dict[str, list[float]] = {"ours": [], "hf": []}
    half = max(1, steps // 2)
    for block in range(2):  # ours, hf, ours, hf: drift hits both
        for name in ("ours", "hf"):
            times[name] += _time_steps(make_step(name), batches[: warmup + half], warmup if block == 0 else 0,
                                       device)
    positions = micro * seq
    out = {"seq": seq, "micro_batch": micro,
           "ours_tokens_per_s": [positions / t for t in times["ours"]],
           "hf_tokens_per_s": [positions / t for t in times["hf"]]}
    n = min(len(times["ours"]), len(times["hf"]))
    out["ratio_ours_over_hf"] = [times["hf"][i] / times["ours"][i] for i in range(n)]
    del ours, hf, opts
    if device.type == "cuda":
        torch.cuda.empty_cache()
    return out


def main(argv: list[str] | None = None) -> int:
    """Run the GPU check; prints a summary and writes JSON to ``--out``. Returns 0, or 2 without a CUDA GPU."""
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--seqs", type=int, nargs="+", default=[128, 512])
    p.add_argument("--model", default="albert-base", help="preset in configs/model/")
    p.add_argument("--device", choices=("cuda", "cpu"), default="cuda", help="cpu: smoke test of this script only")
    p.add_argument("--steps", type=int, default=30, help="timed steps per measurement")
    p.add_argument("--warmup", type=int, default=5)
    p.add_argument("--micro-batch", type=int, default=None, help=f"sequences per step (default {MICRO_BATCH})")
    p.add_argument("--skip-hf", action="store_true", help="skip the comparison with transformers")
    p.add_argument("--out", default=None, help="write the figures here as JSON")
    args = p.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s gpu_step %(levelname)s %(message)s")
    if args.device == "cuda" and not torch.cuda.is_available():
        print("gpu_step: no CUDA device visible to torch "
              f"(torch {torch.__version__}, CUDA build {torch.version.cuda})", file=sys.stderr)
        return 2
    from albert_dist.engine.distributed import init_distributed
    from albert_dist.engine.metrics import measure_peak_tflops

    init_distributed(timeout_s=300)
    if args.device == "cuda":
        device = torch.device("cuda", torch.cuda.current_device())
        name = torch.cuda.get_device_name(device)
    else:
        device, name = torch.device("cpu"), "cpu (smoke test)"
    peak = datasheet_peak_tflops(name)
    # A bf16 matmul on CPU takes tens of seconds: the smoke test skips it.
    measured = measure_peak_tflops(device, torch.bfloat16, seconds=1.0) if device.type == "cuda" else float("nan")
    result: dict[str, Any] = {
        "device": name, "model": args.model, "peak_bf16_tflops_datasheet": peak,
        "bf16_matmul_tflops_measured": measured,
        "torch": torch.__version__, "cuda": torch.version.cuda, "engine": {}, "model_step": {},
    }
    import deepspeed

    result["deepspeed"] = deepspeed.__version__
    print(f"device {name}; datasheet dense bf16 peak {peak} TFLOP/s; measured bf16 matmul {measured:.0f} TFLOP/s")
    for seq in args.seqs:
        r = engine_steps(args.model, seq, args.steps, args.warmup, device, peak, args.micro_batch)
        result["engine"][str(seq)] = r
        med = statistics.median
        mfu = f"MFU {med(r['mfu']):.1%}" if "mfu" in r else "MFU n/a (unknown device peak)"
        print(f"ZeRO-2 bf16 {args.model} S={seq} B={r['micro_batch']}: {med(r['tokens_per_s']):,.0f} tokens/s "
              f"(min {min(r['tokens_per_s']):,.0f}, max {max(r['tokens_per_s']):,.0f}), non-pad "
              f"{med(r['non_pad_tokens_per_s']):,.0f} tokens/s, {r['model_tflops_per_s']:.0f} model TFLOP/s, "
              f"{mfu}, peak memory {r['peak_memory_gib']:.2f} GiB, loss {r['loss_first']:.2f} -> "
              f"{r['loss_last']:.2f}; loader (prefetch) {r['loader_tokens_per_s_prefetch']:,.0f} tokens/s")
        if not args.skip_hf:
            h = model_step_vs_hf(args.model, seq, args.steps, args.warmup, device, args.micro_batch)
            result["model_step"][str(seq)] = h
            print(f"model step S={seq} B={h['micro_batch']} bf16 autocast: ours {med(h['ours_tokens_per_s']):,.0f} "
                  f"vs transformers {med(h['hf_tokens_per_s']):,.0f} tokens/s; ratio ours/transformers median "
                  f"{med(h['ratio_ours_over_hf']):.2f} (min {min(h['ratio_ours_over_hf']):.2f}, max "
                  f"{max(h['ratio_ours_over_hf']):.2f})")
    if args.out:
        Path(args.out).write_text(json.dumps(result, indent=1) + "\n")
        print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
