"""ALBERT-base bf16 pretraining steps on one NVIDIA GPU: eager vs compiled, static vs dynamic MLM gather, host
syncs, MFU, peak memory, and transformers' model in the same run.

Run on its own on a GPU (bench/gpu_check.py's ``step`` phase reuses `engine_variant`); not part of the CPU suite
(it has no ``run`` function, so bench/run_all.py does not pick it up). For each sequence length (128 and 512), on the bundled
WikiText-2 sample (batches from ``build_train_loader`` with the data defaults: 15% masking, at most 20 per row,
prefetched to the GPU so the figure is the step, not the loader):

1. ``engine``: configs/model/albert-base.yaml, DeepSpeed ZeRO-2, bf16 with fp32 gradient accumulation, AdamW,
   through the project's ``build_deepspeed_config`` / ``build_optimizer`` / ``optimizer_step`` (the trainer's
   step), in up to four variants, each on a fresh engine from the same weights:
   ``eager_dynamic`` (the MLM gather padded to the batch's longest row), ``eager_static`` (the trainer's static
   gather), ``block`` and ``model`` (static + `engine.compile` with that `compile_scope`). Per variant: the first
   step's seconds (the compile), tokens/s (padded positions, the compute run) and non-padding tokens/s, MFU =
   pretraining_flops_per_sequence(S) / S x positions/s / peak (the trainer's definition), peak allocated memory, and the
   host syncs: one step under ``torch.cuda.set_sync_debug_mode("warn")`` with every warning attributed to
   albert_dist, DeepSpeed or other code, then one forward + backward under ``"error"`` (must pass for the
   static variants; the dynamic gather is the control and must raise). Compiled variants run every step after
   the first under ``torch._dynamo.config.error_on_recompile``. MFU against two peaks, as the trainer logs it:
   the datasheet dense bf16 figure (`albert_dist.engine.peaks`, else $ALBERT_DIST_PEAK_TFLOPS) and a bf16 matmul
   measured in the same run (``mfu``, ``mfu_measured_peak``).
2. ``model step vs transformers``: plain PyTorch, no DeepSpeed, bf16 autocast over fp32 weights, fused AdamW,
   the same batches: albert_dist's AlbertForPreTraining (static gather, eager) vs transformers'
   (``attn_implementation="sdpa"``) with the same weights, alternating blocks of steps; ratio ours / transformers.

Measurements run in priority order (eager, then transformers, then the compiled variants) and the ones that
would start after ``--budget-s`` are skipped and listed, so the whole check ends in time on a slow machine.

    python bench/gpu_step.py [--seqs 128 512] [--steps 20] [--variants ...] [--out results.json]
    python bench/gpu_step.py --device cpu --model albert-tiny --seqs 64 --steps 2 --micro-batch 4 \
        --compile-backend eager     # a CPU smoke run
"""
from __future__ import annotations

import argparse
import contextlib
import json
import logging
import os
import statistics
import sys
import time
import warnings
from pathlib import Path
from typing import Any, Optional

import torch

ROOT = Path(__file__).resolve().parents[1]
MODEL_DIR = ROOT / "configs" / "model"
#: Micro batch per sequence length: ~16k positions per step (ALBERT's batch 4096 x 512 is 2M positions per
#: step across many devices; this keeps one step short while the GPU stays busy).
MICRO_BATCH = {128: 128, 512: 32}
VARIANTS = ("eager_dynamic", "eager_static", "block", "model")

log = logging.getLogger("bench.gpu_step")


def datasheet_peak_tflops(device_name: str) -> Optional[float]:
    """Dense bf16 peak of a device by name (`albert_dist.engine.peaks`, the trainer's table), else
    $ALBERT_DIST_PEAK_TFLOPS, else None."""
    from albert_dist.engine.peaks import datasheet_peak

    found = datasheet_peak(device_name, torch.bfloat16)
    env = os.environ.get("ALBERT_DIST_PEAK_TFLOPS")
    return found[0] if found else (float(env) if env else None)


class SyncCounter:
    """Counts device synchronizes while `counting` is true: DeepSpeed's (`get_accelerator().synchronize`, what its
    timers call) and torch's (`torch.cuda.synchronize`, which the CUDA accelerator's calls in turn)."""

    def __init__(self):
        from deepspeed.accelerator import get_accelerator

        self.counts = {"accelerator": 0, "torch.cuda": 0}
        self.counting = False
        self._acc, self._torch_sync = get_accelerator(), torch.cuda.synchronize
        acc_sync = self._acc.synchronize

        def counted(key, fn):
            def wrapper(*args, **kwargs):
                if self.counting:
                    self.counts[key] += 1
                return fn(*args, **kwargs)
            return wrapper
        self._acc.synchronize = counted("accelerator", acc_sync)
        torch.cuda.synchronize = counted("torch.cuda", self._torch_sync)

    def close(self) -> None:
        del self._acc.synchronize  # the instance attribute set above; the class's method shows again
        torch.cuda.synchronize = self._torch_sync


def _prefetch(seq: int, micro_batch: int, n: int, device: torch.device) -> tuple[list[dict], float, Any]:
    """``n`` real batches at sequence length ``seq`` on ``device``, the loader's tokens/s producing them, and the
    data config (its ``prediction_slots`` size the static gather)."""
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
    return [{k: v.to(device, non_blocking=True) for k, v in b.items()} for b in batches], rate, cfg


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _owner(filename: str) -> str:
    return "albert_dist" if "/albert_dist/" in filename else "deepspeed" if "/deepspeed/" in filename else "other"


@contextlib.contextmanager
def sync_debug(mode: str, device: torch.device):
    """``torch.cuda.set_sync_debug_mode(mode)`` inside the block (a no-op on CPU, where nothing syncs)."""
    if device.type != "cuda":
        yield
        return
    before = torch.cuda.get_sync_debug_mode()
    torch.cuda.set_sync_debug_mode(mode)
    try:
        yield
    finally:
        torch.cuda.set_sync_debug_mode(before)


def host_syncs(engine, batch: dict, device: torch.device) -> dict[str, Any]:
    """The host syncs of one training step: a whole `optimizer_step` under sync-debug "warn" (warnings counted by
    the owner of the Python frame that triggered them), then a forward + backward under "error" (the micro-step
    alone; ``error_micro_step`` is None when it ran, else the error's first line)."""
    from albert_dist.engine.loss import label_counts, micro_step_loss, optimizer_step

    counts: dict[str, int] = {"albert_dist": 0, "deepspeed": 0, "other": 0}
    sites: dict[str, int] = {}
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with sync_debug("warn", device):
            optimizer_step(engine, [batch])
            _sync(device)
    for w in caught:
        if "synchroniz" not in str(w.message):
            continue
        owner = _owner(w.filename)
        counts[owner] += 1
        site = f"{w.filename.rsplit('/site-packages/', 1)[-1]}:{w.lineno}"
        sites[site] = sites.get(site, 0) + 1
    error = None
    try:
        with sync_debug("error", device):
            out = engine(**batch)
            engine.backward(micro_step_loss(out, label_counts([batch]), engine.dp_world_size))
    except RuntimeError as err:
        error = str(err).splitlines()[0]
    if error is None:  # after a raise the micro-step is half done: the engine is destroyed next anyway
        engine.step()
        _sync(device)
    return {"checked": device.type == "cuda", "warn_step": counts, "warn_sites": sites, "error_micro_step": error}


def engine_variant(model_name: str, variant: str, batches: list[dict], data_cfg, warmup: int, device: torch.device,
                   peaks: tuple[Optional[float], Optional[float]], backend: str, optimizer: str = "adamw",
                   timers: Optional[bool] = None) -> dict[str, Any]:
    """ZeRO-2 bf16 DeepSpeed steps of preset ``model_name`` in ``variant`` (module docstring) on ``batches``
    (the first ``1 + warmup`` untimed, the first of them timed as the compile step), with ``optimizer``
    (adamw or lamb); ``timers`` True/False turns DeepSpeed's throughput timer on/off over the generated config
    (None: as generated). MFU against both ``peaks`` (datasheet, measured matmul; None: not computed); device
    synchronizes counted over the timed steps (`SyncCounter`)."""
    import deepspeed

    from albert_dist.config import TrainConfig, load_model_config
    from albert_dist.engine.compile import compile_engine, dynamo_counters
    from albert_dist.engine.deepspeed_config import build_deepspeed_config
    from albert_dist.engine.grad_norm import install_exact_clipping
    from albert_dist.engine.loss import optimizer_step
    from albert_dist.engine.metrics import peak_memory_bytes
    from albert_dist.engine.optim import build_optimizer
    from albert_dist.model import AlbertForPreTraining
    from albert_dist.model.flops import pretraining_flops_per_sequence

    micro, seq = batches[0]["input_ids"].shape
    cfg = TrainConfig(model=load_model_config(MODEL_DIR / f"{model_name}.yaml"))
    cfg.engine.zero_stage, cfg.engine.precision, cfg.engine.grad_accum_dtype = 2, "bf16", "fp32"
    cfg.engine.train_micro_batch_size_per_gpu = micro
    cfg.optimizer.type = optimizer
    torch.manual_seed(0)
    slots = None if variant == "eager_dynamic" else data_cfg.prediction_slots
    model = AlbertForPreTraining(cfg.model, max_predictions_per_seq=slots)
    ds_config = build_deepspeed_config(cfg.engine, world_size=1)
    if timers is not None:
        ds_config["timers"] = {"throughput": {"enabled": timers, "synchronized": timers}}
    optimizer_, after_initialize = build_optimizer(model, cfg.optimizer)
    engine, *_ = deepspeed.initialize(model=model, optimizer=optimizer_, config=ds_config)
    after_initialize(engine)  # LAMB: DeepSpeed's partition map (as the trainer)
    install_exact_clipping(engine)
    if variant in ("block", "model"):
        torch._dynamo.reset()
        compile_engine(engine, variant, backend=backend)
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
    losses = []
    graphs0 = dynamo_counters()["unique_graphs"]
    _sync(device)
    t0 = time.perf_counter()
    result = optimizer_step(engine, [batches[0]])
    losses.append(result.outputs[0].loss)
    _sync(device)
    first_s = time.perf_counter() - t0
    graphs = dynamo_counters()["unique_graphs"] - graphs0
    times = []
    no_recompile = (torch._dynamo.config.patch(error_on_recompile=True) if variant in ("block", "model")
                    else contextlib.nullcontext())
    counter = SyncCounter()
    with no_recompile:
        for i, batch in enumerate(batches[1:]):
            _sync(device)
            t = time.perf_counter()
            counter.counting = i >= warmup
            result = optimizer_step(engine, [batch])
            counter.counting = False
            _sync(device)
            if i >= warmup:
                times.append(time.perf_counter() - t)
            losses.append(result.outputs[0].loss)
        counter.close()
        syncs = host_syncs(engine, batches[-1], device)
    positions = micro * seq
    real = [int(b["attention_mask"].sum()) for b in batches[1 + warmup:]]
    tps = [positions / t for t in times]
    flops = pretraining_flops_per_sequence(cfg.model, seq, data_cfg.prediction_slots) / seq  # per position
    out = {
        "variant": variant, "seq": seq, "micro_batch": micro, "slots_per_row": None if slots is None else slots + 1,
        "first_step_s": first_s, "graphs": graphs, "steps": len(times), "step_s": times, "tokens_per_s": tps,
        "non_pad_tokens_per_s": [r / t for r, t in zip(real, times)],
        "peak_memory_gib": peak_memory_bytes(device) / 2**30,  # allocated on CUDA, RSS on CPU
        "loss_first": float(losses[0]), "loss_last": float(losses[-1]),
        "model_tflops_per_s": statistics.median(tps) * flops / 1e12, "syncs": syncs, "optimizer": optimizer,
        "ds_timers": ds_config.get("timers", "DeepSpeed's default (throughput timer on, synchronized)"),
        "device_syncs_per_step": {k: v / max(1, len(times)) for k, v in counter.counts.items()},
    }
    for key, peak in zip(("mfu", "mfu_measured_peak"), peaks):
        if peak:
            out[key] = [t * flops / (peak * 1e12) for t in tps]
    engine.destroy()
    del engine, model
    if device.type == "cuda":
        torch.cuda.empty_cache()
    return out


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


def model_step_vs_hf(model_name: str, batches: list[dict], data_cfg, warmup: int, steps: int,
                     device: torch.device) -> dict[str, Any]:
    """Plain bf16-autocast training steps of ours (static gather) vs transformers' ALBERT (same weights, batches)."""
    from albert_dist.config import load_model_config
    from albert_dist.model import AlbertForPreTraining
    from albert_dist.model.hf import to_transformers

    micro, seq = batches[0]["input_ids"].shape
    torch.manual_seed(0)
    ours = AlbertForPreTraining(load_model_config(MODEL_DIR / f"{model_name}.yaml"),
                                max_predictions_per_seq=data_cfg.prediction_slots)
    hf = to_transformers(ours)  # attn_implementation="sdpa"
    ours, hf = ours.to(device).train(), hf.to(device).train()
    fused = device.type == "cuda"
    opts = {"ours": torch.optim.AdamW(ours.parameters(), lr=1e-4, fused=fused),
            "hf": torch.optim.AdamW(hf.parameters(), lr=1e-4, fused=fused)}

    def make_step(name, model, opt):
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
            step = make_step(name, ours if name == "ours" else hf, opts[name])
            times[name] += _time_steps(step, batches[: warmup + half], warmup if block == 0 else 0, device)
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


def _summary(r: dict[str, Any]) -> str:
    med = statistics.median
    mfu = f"MFU {med(r['mfu']):.1%}" if "mfu" in r else "MFU n/a (no datasheet peak)"
    if "mfu_measured_peak" in r:
        mfu += f" ({med(r['mfu_measured_peak']):.1%} of the measured matmul peak)"
    s = r["syncs"]
    sync = (f"syncs/step albert_dist {s['warn_step']['albert_dist']}, deepspeed {s['warn_step']['deepspeed']}, "
            f"other {s['warn_step']['other']}; micro-step under 'error': "
            + ("ok" if s["error_micro_step"] is None else f"raised ({s['error_micro_step'][:80]})")
            if s["checked"] else "syncs not checked (CPU)")
    return (f"S={r['seq']} B={r['micro_batch']} {r['variant']:<13}: first step {r['first_step_s']:.1f} s "
            f"({r['graphs']} graphs), {med(r['tokens_per_s']):,.0f} tokens/s (min {min(r['tokens_per_s']):,.0f}, "
            f"max {max(r['tokens_per_s']):,.0f}), non-pad {med(r['non_pad_tokens_per_s']):,.0f}, "
            f"{r['model_tflops_per_s']:.0f} model TFLOP/s, {mfu}, peak {r['peak_memory_gib']:.2f} GiB, loss "
            f"{r['loss_first']:.2f} -> {r['loss_last']:.2f}; {sync}")


def main(argv: list[str] | None = None) -> int:
    """Run the GPU check; prints a summary and writes JSON to ``--out``. Returns 0, or 2 without a CUDA GPU."""
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--seqs", type=int, nargs="+", default=[128, 512])
    p.add_argument("--model", default="albert-base", help="preset in configs/model/")
    p.add_argument("--device", choices=("cuda", "cpu"), default="cuda", help="cpu: smoke test of this script only")
    p.add_argument("--steps", type=int, default=20, help="timed steps per measurement")
    p.add_argument("--warmup", type=int, default=3, help="untimed steps after the first (compiling) one")
    p.add_argument("--micro-batch", type=int, default=None, help=f"sequences per step (default {MICRO_BATCH})")
    p.add_argument("--variants", nargs="+", default=list(VARIANTS), choices=VARIANTS)
    p.add_argument("--compile-backend", default="inductor", help="torch.compile backend of the compiled variants")
    p.add_argument("--skip-hf", action="store_true", help="skip the comparison with transformers")
    p.add_argument("--budget-s", type=float, default=float("inf"),
                   help="seconds after which no further measurement starts (the rest are listed as skipped)")
    p.add_argument("--out", default=None, help="write the figures here as JSON")
    args = p.parse_args(argv)
    start = time.perf_counter()
    logging.basicConfig(level=logging.INFO, format="%(asctime)s gpu_step %(levelname)s %(message)s")
    if args.device == "cuda" and not torch.cuda.is_available():
        print("gpu_step: no CUDA device visible to torch "
              f"(torch {torch.__version__}, CUDA build {torch.version.cuda})", file=sys.stderr)
        return 2
    from albert_dist.distributed.group import init_distributed
    from albert_dist.engine.metrics import measure_peak_tflops

    init_distributed(timeout_s=300)
    if args.device == "cuda":
        device = torch.device("cuda", torch.cuda.current_device())
        name = torch.cuda.get_device_name(device)
    else:
        device, name = torch.device("cpu"), "cpu (smoke test)"
    peak = datasheet_peak_tflops(name)
    # A bf16 matmul on CPU takes tens of seconds: the smoke test measures fp32.
    measured = measure_peak_tflops(device, torch.bfloat16 if device.type == "cuda" else torch.float32,
                                   seconds=1.0 if device.type == "cuda" else 0.2)
    import deepspeed

    result: dict[str, Any] = {
        "device": name, "model": args.model, "peak_bf16_tflops_datasheet": peak,
        "matmul_tflops_measured": measured, "torch": torch.__version__, "cuda": torch.version.cuda,
        "deepspeed": deepspeed.__version__, "compile_backend": args.compile_backend, "engine": {},
        "model_step": {}, "skipped": [],
    }
    print(f"device {name}; datasheet dense bf16 peak {peak} TFLOP/s; measured matmul {measured:.3g} TFLOP/s")
    data: dict[int, tuple[list[dict], float, Any]] = {}
    for seq in args.seqs:
        micro = args.micro_batch or MICRO_BATCH.get(seq, max(1, 16384 // seq))
        data[seq] = _prefetch(seq, micro, 1 + args.warmup + args.steps, device)
        print(f"S={seq}: loader (prefetch) {data[seq][1]:,.0f} tokens/s")
    # Priority order: what a budget overrun drops first comes last.
    plan = [("engine", seq, v) for v in args.variants if v.startswith("eager") for seq in args.seqs]
    plan += [] if args.skip_hf else [("hf", seq, None) for seq in args.seqs]
    plan += [("engine", seq, v) for v in args.variants if not v.startswith("eager") for seq in args.seqs]
    for kind, seq, variant in plan:
        what = f"{kind} S={seq}" + (f" {variant}" if variant else "")
        if time.perf_counter() - start > args.budget_s:
            result["skipped"].append(what)
            print(f"skipped (budget {args.budget_s:.0f} s spent): {what}")
            continue
        batches, _, data_cfg = data[seq]
        try:
            if kind == "engine":
                r = engine_variant(args.model, variant, batches, data_cfg, args.warmup, device, (peak, measured),
                                   args.compile_backend)
                result["engine"].setdefault(str(seq), {})[variant] = r
                print(_summary(r), flush=True)
            else:
                h = model_step_vs_hf(args.model, batches, data_cfg, args.warmup, args.steps, device)
                result["model_step"][str(seq)] = h
                med = statistics.median
                print(f"model step S={seq} B={h['micro_batch']} bf16 autocast: ours {med(h['ours_tokens_per_s']):,.0f} "
                      f"vs transformers {med(h['hf_tokens_per_s']):,.0f} tokens/s; ratio ours/transformers median "
                      f"{med(h['ratio_ours_over_hf']):.2f} (min {min(h['ratio_ours_over_hf']):.2f}, max "
                      f"{max(h['ratio_ours_over_hf']):.2f})", flush=True)
        except Exception as err:  # one failed measurement must not cost the others
            log.exception("%s failed", what)
            result.setdefault("failed", {})[what] = f"{type(err).__name__}: {err}"
        if args.out:  # after every measurement: a run killed at its time limit keeps what it measured
            Path(args.out).write_text(json.dumps(result, indent=1) + "\n")
    for seq, variants in result["engine"].items():  # ratios within the run
        med = statistics.median
        base = variants.get("eager_static")
        ratios = {}
        if base and "eager_dynamic" in variants:
            ratios["static_over_dynamic"] = med(base["tokens_per_s"]) / med(variants["eager_dynamic"]["tokens_per_s"])
        for scope in ("block", "model"):
            if base and scope in variants:
                ratios[f"{scope}_over_eager"] = med(variants[scope]["tokens_per_s"]) / med(base["tokens_per_s"])
        result.setdefault("ratios", {})[seq] = ratios
        print(f"S={seq} ratios (tokens/s): " + ", ".join(f"{k} {v:.3f}" for k, v in ratios.items()))
    result["seconds"] = time.perf_counter() - start
    if args.out:
        Path(args.out).write_text(json.dumps(result, indent=1) + "\n")
        print(f"wrote {args.out}")
    return 1 if result.get("failed") else 0


if __name__ == "__main__":
    sys.exit(main())
