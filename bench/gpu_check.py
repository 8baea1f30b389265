"""The phases of bench/gpu_check.sh, one per call, each writing ``$OUT/phases/<phase>.json``; ``summary`` gathers
them (with each phase's exit code, seconds and time limit from the script) into ``$OUT/summary.json``.

    python bench/gpu_check.py PHASE --out DIR [--cpu]     # PHASE: env attention step exactness pretrain downstream
    python bench/gpu_check.py summary --out DIR

- ``env``: versions, device, the matmul and attention flags, the matmul peak measured here and the datasheet one
  (`albert_dist.engine.peaks`), where deepspeed was imported from (the kit or the image).
- ``attention``: F.scaled_dot_product_attention at ALBERT-base's shape, forward + backward, under each backend
  (math, flash, efficient, cudnn), with the model's boolean key mask and without one; which kernel the default
  dispatch runs (torch.profiler), for a bare call and for one forward of the model on an unpadded batch.
- ``step``: bench/gpu_step.py's ``engine_variant`` (albert-base, ZeRO-2, bf16, the trainer's static gather) at
  S = 128 and 512: tokens/s, MFU against both peaks, device synchronizes per step; at S = 128 also DeepSpeed's
  throughput timer forced on vs off, and LAMB instead of AdamW.
- ``exactness``: gradients of one batch, a shared ALBERT (dropout 0): bf16 on the device vs fp32 on CPU, as a
  ratio to bf16 on CPU vs fp32 on CPU (the CPU floor: docs/gradients.md); fp32 on the device (TF32 off) vs fp32
  on CPU.
- ``pretrain``: `albert-dist train` (configs/pretrain/albert-tiny-wikitext.yaml; bf16 on CUDA) stopped by SIGTERM
  once half its time is spent (exit 75, a checkpoint), resumed with ``--resume auto`` to twice the steps (exit 0),
  then `albert-dist export`; its metrics (both MFUs, and any data-wait or sync metric the trainer logs).
- ``downstream``: `albert-dist finetune` on SST-2 (``.gpu_data``) of the exported model and of ``--init random``,
  seeds 1 2 3 each: dev accuracy per seed, median, and the difference of the medians.

``--cpu`` runs every phase at tiny sizes (what CI runs: tests/integration/test_gpu_check_smoke.py).
"""
from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Callable

ROOT = Path(__file__).resolve().parents[1]
PHASES = ("env", "attention", "step", "exactness", "pretrain", "downstream")
RECIPE = "configs/pretrain/albert-tiny-wikitext.yaml"
#: Per phase, CUDA and CPU sizes (the CPU ones only check that the phase runs).
SIZES: dict[str, dict[str, Any]] = {
    "attention": {"cuda": dict(batch=32, heads=12, seq=512, head_dim=64, repeats=20),
                  "cpu": dict(batch=2, heads=2, seq=32, head_dim=16, repeats=2)},
    "step": {"cuda": dict(model="albert-base", seqs=(128, 512), steps=10, warmup=2, micro={128: 128, 512: 32}),
             "cpu": dict(model="albert-tiny", seqs=(32,), steps=1, warmup=0, micro={32: 2})},
    "exactness": {"cuda": dict(hidden=256, layers=6, batch=8, seq=128), "cpu": dict(hidden=32, layers=3, batch=2, seq=16)},
    "pretrain": {"cuda": dict(seconds=140, overrides=["engine.train_micro_batch_size_per_gpu=64",
                                                      "data.num_workers=4", "log_interval_steps=20", "eval_interval_steps=100000",
                                                      "data.eval_examples=512"]),
                 "cpu": dict(seconds=0, overrides=["engine.train_micro_batch_size_per_gpu=2", "data.max_seq_length=32",
                                                   "data.max_predictions_per_seq=4", "data.num_workers=0",
                                                   "data.eval_examples=8", "log_interval_steps=1",
                                                   "eval_interval_steps=100000", "model.hidden_size=32",
                                                   "model.intermediate_size=64", "model.num_attention_heads=2",
                                                   "model.embedding_size=16"])},
    "downstream": {"cuda": ["--max-train-samples", "16000", "--epochs", "1", "--bf16"],
                   "cpu": ["--max-train-samples", "16", "--max-eval-samples", "16", "--epochs", "1", "--batch-size", "8",
                           "--max-seq-length", "32"]},
}


def _device(cpu: bool):
    import torch

    return torch.device("cpu") if cpu else torch.device("cuda", torch.cuda.current_device())


def _sync(device) -> None:
    import torch

    if device.type == "cuda":
        torch.cuda.synchronize(device)


def phase_env(out: Path, cpu: bool) -> dict[str, Any]:
    import importlib.metadata as md

    import torch

    from albert_dist.engine.metrics import measure_peak_tflops
    from albert_dist.engine.peaks import datasheet_peak

    device = _device(cpu)
    versions = {}
    for dist in ("torch", "deepspeed", "transformers", "datasets", "torchdata", "omegaconf", "sentencepiece",
                 "pyarrow", "numpy", "accelerate", "mlflow-skinny", "mlflow", "tenacity", "zstandard"):
        try:
            versions[dist] = md.version(dist)
        except md.PackageNotFoundError:
            versions[dist] = None
    import importlib.util

    name = torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"
    peaks = {}
    for dtype in (torch.bfloat16, torch.float32):
        key = str(dtype).removeprefix("torch.")
        if device.type == "cpu" and dtype == torch.bfloat16:
            continue  # seconds per bf16 matmul on a CPU without native bf16: not a peak worth waiting for
        peaks[f"measured_{key}_tflops"] = measure_peak_tflops(device, dtype, seconds=1.0 if device.type == "cuda" else 0.1)
        found = datasheet_peak(name, dtype)
        peaks[f"datasheet_{key}_tflops"] = found[0] if found else None
    flags = {
        "cuda_matmul_allow_tf32": torch.backends.cuda.matmul.allow_tf32,
        "cudnn_allow_tf32": torch.backends.cudnn.allow_tf32, "float32_matmul_precision": torch.get_float32_matmul_precision(),
        "sdp_flash": torch.backends.cuda.flash_sdp_enabled(), "sdp_mem_efficient": torch.backends.cuda.mem_efficient_sdp_enabled(),
        "sdp_math": torch.backends.cuda.math_sdp_enabled(), "sdp_cudnn": torch.backends.cuda.cudnn_sdp_enabled(),
        "env": {k: os.environ.get(k) for k in ("CUDA_VISIBLE_DEVICES", "HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE",
                                               "TRANSFORMERS_OFFLINE", "OMP_NUM_THREADS", "PYTHONPATH")},
    }
    result = {"python": sys.version.split()[0], "versions": versions, "deepspeed_from": str(Path(importlib.util.find_spec("deepspeed").origin).parent),
              "cuda": torch.version.cuda, "cudnn": torch.backends.cudnn.version() if device.type == "cuda" else None,
              "device": name, "device_count": torch.cuda.device_count(),
              "capability": list(torch.cuda.get_device_capability(device)) if device.type == "cuda" else None,
              "flags": flags, "peaks": peaks}
    print(f"env: {name}, torch {versions['torch']} (CUDA {torch.version.cuda}), deepspeed {versions['deepspeed']} "
          f"from {result['deepspeed_from']}; peaks {peaks}")
    return result


def phase_attention(out: Path, cpu: bool) -> dict[str, Any]:
    import torch
    import torch.nn.functional as F
    from torch.nn.attention import SDPBackend, sdpa_kernel

    device = _device(cpu)
    size = SIZES["attention"]["cpu" if cpu else "cuda"]
    B, nh, S, hd = size["batch"], size["heads"], size["seq"], size["head_dim"]
    dtype = torch.float32 if cpu else torch.bfloat16
    g = torch.Generator(device="cpu").manual_seed(0)
    q, k, v = (torch.randn(B, nh, S, hd, generator=g).to(device, dtype).requires_grad_() for _ in range(3))
    mask = torch.ones(B, 1, 1, S, dtype=torch.bool, device=device)  # the model's key mask of an unpadded batch

    def timed(m) -> float:
        times = []
        for i in range(size["repeats"] + 1):
            _sync(device)
            t = time.perf_counter()
            F.scaled_dot_product_attention(q, k, v, attn_mask=m).sum().backward()
            _sync(device)
            if i:
                times.append(time.perf_counter() - t)
        return statistics.median(times) * 1e3

    backends = {}
    for backend in (SDPBackend.MATH, SDPBackend.FLASH_ATTENTION, SDPBackend.EFFICIENT_ATTENTION, SDPBackend.CUDNN_ATTENTION):
        for masked in (False, True):
            key = f"{backend.name.lower()}_{'mask' if masked else 'no_mask'}_ms"
            try:
                with sdpa_kernel(backend):
                    backends[key] = timed(mask if masked else None)
            except RuntimeError as err:  # this backend cannot take these inputs here
                backends[key] = f"not eligible: {str(err).splitlines()[0][:160]}"
    result = {"shape": [B, nh, S, hd], "dtype": str(dtype), "forward_backward": backends,
              "default_kernels": {"no_mask": _sdpa_kernels(lambda: F.scaled_dot_product_attention(q, k, v)),
                                  "mask": _sdpa_kernels(lambda: F.scaled_dot_product_attention(q, k, v, attn_mask=mask)),
                                  "model_unpadded_batch": _model_kernels(device, dtype, cpu)}}
    print(f"attention {result['shape']} {dtype}: " + ", ".join(
        f"{k} {v:.3g}" if isinstance(v, float) else f"{k} n/a" for k, v in backends.items()))
    print(f"attention kernels by default: {result['default_kernels']}")
    return result


def _sdpa_kernels(fn: Callable[[], Any]) -> list[str]:
    """The attention operators and kernels a call runs (profiler event names naming attention)."""
    from torch.profiler import ProfilerActivity, profile

    import torch

    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if torch.cuda.is_available() else [])
    with profile(activities=activities) as prof:
        fn()
    words = ("attention", "flash", "fmha", "sdpa", "cudnn")
    return sorted({e.name for e in prof.events() if any(w in e.name.lower() for w in words)
                   and not e.name.startswith("aten::scaled_dot_product_attention")})[:12]


def _model_kernels(device, dtype, cpu: bool) -> list[str]:
    """The kernels of one AlbertModel forward on an unpadded batch: whether the model's call is eligible for the
    fused kernels (a boolean mask keeps FlashAttention out)."""
    import torch

    from albert_dist.config import load_model_config
    from albert_dist.model.albert import AlbertModel

    config = load_model_config(ROOT / "configs" / "model" / ("albert-tiny.yaml" if cpu else "albert-base.yaml"))
    model = AlbertModel(config).to(device, dtype).eval()
    B, S = 2, 64
    ids = torch.randint(5, config.vocab_size, (B, S), device=device)
    ones = torch.ones(B, S, dtype=torch.long, device=device)
    with torch.no_grad():
        return _sdpa_kernels(lambda: model(ids, ones, torch.zeros_like(ids)))


def phase_step(out: Path, cpu: bool) -> dict[str, Any]:
    import torch

    sys.path.insert(0, str(ROOT / "bench"))
    import gpu_step

    from albert_dist.distributed.group import init_distributed
    from albert_dist.engine.metrics import measure_peak_tflops

    init_distributed(timeout_s=300)
    device = _device(cpu)
    size = SIZES["step"]["cpu" if cpu else "cuda"]
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"
    peaks = (gpu_step.datasheet_peak_tflops(name),
             measure_peak_tflops(device, torch.float32 if cpu else torch.bfloat16, seconds=0.1 if cpu else 1.0))
    runs = []
    seq0 = size["seqs"][0]
    # the generated config at each length; at the first, DeepSpeed's throughput timer on and off, and LAMB (on CPU
    # two engines only: AdamW with the timer off, LAMB with it on)
    plan = [(seq0, "adamw", False), (seq0, "lamb", True)] if cpu else (
        [(seq, "adamw", None) for seq in size["seqs"]] + [(seq0, "adamw", True), (seq0, "adamw", False), (seq0, "lamb", None)])
    result: dict[str, Any] = {"model": size["model"], "peaks_tflops": {"datasheet": peaks[0], "measured": peaks[1]},
                              "runs": runs}
    data = {}
    for seq, optimizer, timers in plan:
        if seq not in data:
            data[seq] = gpu_step._prefetch(seq, size["micro"][seq], 2 + size["warmup"] + size["steps"], device)
        batches, _, data_cfg = data[seq]
        r = gpu_step.engine_variant(size["model"], "eager_static", batches, data_cfg, size["warmup"], device, peaks,
                                    "eager", optimizer=optimizer, timers=timers)
        med = {k: statistics.median(r[k]) for k in ("tokens_per_s", "mfu", "mfu_measured_peak") if k in r}
        row = {"seq": seq, "optimizer": optimizer, "ds_timers": r["ds_timers"], "micro_batch": r["micro_batch"],
               **{f"{k}_median": v for k, v in med.items()}, "device_syncs_per_step": r["device_syncs_per_step"],
               "host_syncs": r["syncs"], "peak_memory_gib": r["peak_memory_gib"], "loss_first": r["loss_first"],
               "loss_last": r["loss_last"]}
        runs.append(row)
        print(f"step S={seq} {optimizer} timers={timers}: {med}, syncs/step {r['device_syncs_per_step']}", flush=True)
        (out / "phases" / "step.partial.json").write_text(json.dumps(result, indent=1))
    return result


def _grads(model, batch) -> dict[str, Any]:
    model.zero_grad(set_to_none=True)
    model(**batch).loss.backward()
    return {n: p.grad.detach().float().cpu() for n, p in model.named_parameters() if p.grad is not None}


def _errors(a: dict, ref: dict) -> dict[str, float]:
    """Per-tensor worst relative L2 error (a tensor's norm floored at 1e-3 x the largest one's: a gradient near 0,
    such as an unused token type's, has no relative error worth the name), and the whole model's."""
    import torch

    floor = 1e-3 * max(float(t.norm()) for t in ref.values())
    per = [float((a[n] - ref[n]).norm()) / max(float(ref[n].norm()), floor) for n in ref]
    whole = float(torch.cat([(a[n] - ref[n]).flatten() for n in ref]).norm()
                  / torch.cat([ref[n].flatten() for n in ref]).norm())
    return {"per_tensor_max": max(per), "whole_model": whole}


def phase_exactness(out: Path, cpu: bool) -> dict[str, Any]:
    import copy

    import torch

    from albert_dist.model import AlbertConfig, AlbertForPreTraining

    device = _device(cpu)
    size = SIZES["exactness"]["cpu" if cpu else "cuda"]
    H, L, B, S = size["hidden"], size["layers"], size["batch"], size["seq"]
    config = AlbertConfig(vocab_size=1000, embedding_size=H // 2, hidden_size=H, num_attention_heads=4,
                          intermediate_size=4 * H, num_hidden_layers=L, num_hidden_groups=1, max_position_embeddings=S,
                          hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)
    torch.manual_seed(0)
    # bf16-rounded weights for every run, as DeepSpeed casts the module before its fp32 master copy
    base = AlbertForPreTraining(config, max_predictions_per_seq=S // 4).to(torch.bfloat16).float()
    ids = torch.randint(5, 1000, (B, S))
    labels = torch.full((B, S), -100)
    labels[:, 1:S // 4] = ids[:, 1:S // 4]
    batch = dict(input_ids=ids, attention_mask=torch.ones(B, S, dtype=torch.long), token_type_ids=torch.zeros(B, S, dtype=torch.long),
                 mlm_labels=labels, sop_labels=torch.zeros(B, dtype=torch.long))

    def run(dev, dtype):
        model = copy.deepcopy(base).to(dev, dtype)
        return _grads(model, {k: v.to(dev) for k, v in batch.items()})

    tf32 = torch.backends.cuda.matmul.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = False
    try:
        cpu32, cpu16 = run(torch.device("cpu"), torch.float32), run(torch.device("cpu"), torch.bfloat16)
        dev32, dev16 = run(device, torch.float32), run(device, torch.bfloat16)
    finally:
        torch.backends.cuda.matmul.allow_tf32 = tf32
    floor = _errors(cpu16, cpu32)
    bf16 = _errors(dev16, cpu32)
    result = {"model": {"hidden": H, "layers": L, "sharing": config.sharing, "batch": B, "seq": S},
              "cpu_bf16_vs_cpu_fp32 (floor)": floor, "device_bf16_vs_cpu_fp32": bf16,
              "ratio_to_floor": {k: bf16[k] / floor[k] for k in floor},
              "device_fp32_vs_cpu_fp32 (TF32 off)": _errors(dev32, cpu32),
              "docs_gradients_md": "ideal bf16 from fp32: 2.7-6.7e-2 per tensor, 1.4-2.6e-2 whole model; DeepSpeed "
                                   "bf16 at most 1.1x ideal (CPU)"}
    print(f"exactness: {json.dumps(result)}")
    return result


def _cli(*args: str) -> list[str]:
    return [sys.executable, "-m", "albert_dist.cli", *args]


def _in_process(*args: str) -> int:
    """`albert-dist ARGS` in this process (its output in this phase's log): one interpreter start less than a
    subprocess, seconds on a loaded CPU."""
    from albert_dist.cli import main

    return main(list(args))


def _records(run_dir: Path) -> list[dict]:
    path = run_dir / "metrics.jsonl"
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def phase_pretrain(out: Path, cpu: bool) -> dict[str, Any]:
    size = SIZES["pretrain"]["cpu" if cpu else "cuda"]
    run_dir = out / "pretrain_run"
    common = ["--config", RECIPE, f"run_dir={run_dir}", "tracking.enabled=false", "progress_bar=false", "engine.precision=bf16",
              "optimizer.warmup_ratio=null", f"optimizer.warmup_steps={2 if cpu else 100}", *size["overrides"]]
    half = size["seconds"] / 2
    log1 = open(out / "pretrain_1.log", "w")
    start = time.perf_counter()
    proc = subprocess.Popen(_cli("train", *common, "max_steps=100000"), cwd=ROOT, stdout=log1, stderr=subprocess.STDOUT)
    # the stop signal goes once a step is logged (earlier, the signal handlers may not be installed yet) and half
    # the phase's time has passed
    while proc.poll() is None and (not any("train/loss" in r for r in _records(run_dir)) or time.perf_counter() - start < half):
        time.sleep(0.5)
    signalled_s = time.perf_counter() - start
    proc.send_signal(signal.SIGTERM)
    rc1 = proc.wait(timeout=300)
    steps1 = int((run_dir / "checkpoints" / "latest").read_text().strip().removeprefix("step_")) if rc1 == 75 else None
    result: dict[str, Any] = {"signal_after_s": signalled_s, "first_exit": rc1, "stopped_at_step": steps1}
    if steps1 is None:
        raise RuntimeError(f"the stopped run exited {rc1}, not 75 with a checkpoint (see pretrain_1.log)")
    with open(out / "pretrain_2.log", "w") as log2:
        rc2 = subprocess.run(_cli("train", *common, f"max_steps={2 * steps1}", "--resume", "auto"), cwd=ROOT,
                             stdout=log2, stderr=subprocess.STDOUT, timeout=600).returncode
    records = [r for r in _records(run_dir) if "train/loss" in r]
    steps = [r["step"] for r in records]
    export_dir = out / "pretrain_export"
    rc3 = _in_process("export", str(run_dir), "--output", str(export_dir))
    extra = sorted({k for r in records for k in r if "wait" in k or "sync" in k or "skipped" in k or "overflow" in k})
    last = records[-1] if records else {}
    result.update({
        "resumed_exit": rc2, "export_exit": rc3, "max_steps": 2 * steps1, "last_step": steps[-1] if steps else None,
        "steps_continue": bool(steps) and steps == sorted(set(steps)) and steps[-1] == 2 * steps1,
        "loss_first": records[0]["train/loss"] if records else None, "loss_last": last.get("train/loss"),
        "perf_last": {k: v for k, v in last.items() if k.startswith("perf/")},
        "other_metrics_last": {k: last[k] for k in extra if k in last}, "export_files": sorted(
            p.name for p in export_dir.iterdir()) if export_dir.is_dir() else [], "seconds": time.perf_counter() - start})
    print(f"pretrain: {json.dumps(result)}")
    if rc2 != 0 or rc3 != 0 or not result["steps_continue"]:
        raise RuntimeError(f"resume exited {rc2}, export {rc3}, steps continue {result['steps_continue']} "
                           "(pretrain_2.log, pretrain.log)")
    return result


def phase_downstream(out: Path, cpu: bool) -> dict[str, Any]:
    model = out / "pretrain_export"
    if not model.is_dir():
        raise RuntimeError(f"{model} is missing: the pretrain phase did not export")
    data = Path(os.environ.get("GPU_DATA", ROOT / ".gpu_data"))
    if not (data / "train.tsv").is_file():
        raise RuntimeError(f"{data}/train.tsv is missing: run `make gpu-kit` and carry .gpu_data")
    result: dict[str, Any] = {}
    for init in ("pretrained", "random"):
        dest = out / f"downstream_{init}"
        rc = _in_process("finetune", str(model), "--task", "sst2", "--data-dir", str(data), "--init", init, "--seeds",
                         "1", "2", "3", "--no-tracking", "--output", str(dest), *SIZES["downstream"]["cpu" if cpu else "cuda"])
        if rc != 0:
            raise RuntimeError(f"finetune --init {init} exited {rc}")
        entry = json.loads((dest / "downstream.json").read_text())["results"][-1]
        accuracy = {seed: s["accuracy"] for seed, s in entry["seeds"].items()}
        result[init] = {"accuracy": accuracy, "median": statistics.median(accuracy.values()),
                        "train_examples": entry["train_examples"], "dev_examples": entry["dev_examples"]}
    result["pretrained_minus_random"] = result["pretrained"]["median"] - result["random"]["median"]
    print(f"downstream: {json.dumps(result)}")
    return result


def summary(out: Path) -> dict[str, Any]:
    """``$OUT/summary.json`` from ``phases.tsv`` (phase, exit code, seconds, limit: gpu_check.sh's records) and
    each phase's JSON; a phase without a record or JSON is listed as not run."""
    rows = {}
    tsv = out / "phases.tsv"
    for line in tsv.read_text().splitlines() if tsv.exists() else []:
        name, rc, seconds, limit = line.split("\t")
        rows[name] = {"exit": int(rc), "seconds": int(seconds), "limit_s": int(limit)}
    phases = {}
    for name in PHASES:
        row = rows.get(name)
        path = out / "phases" / f"{name}.json"
        if row is None:
            phases[name] = {"status": "not run"}
            continue
        status = "ok" if row["exit"] == 0 else ("timeout" if row["exit"] in (124, 137) else "failed")
        phases[name] = {"status": status, **row, "log": f"{name}.log",
                        "result": json.loads(path.read_text()) if path.exists() else None}
    result = {"phases": phases, "ok": all(p["status"] == "ok" for p in phases.values()),
              "seconds": sum(p.get("seconds", 0) for p in phases.values())}
    (out / "summary.json").write_text(json.dumps(result, indent=1) + "\n")
    for name, p in phases.items():
        print(f"  {name:<11} {p['status']:<8} {p.get('seconds', '-')!s:>4} s")
    return result


PHASE_FUNCTIONS = {"env": phase_env, "attention": phase_attention, "step": phase_step, "exactness": phase_exactness,
                   "pretrain": phase_pretrain, "downstream": phase_downstream}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("phase", choices=(*PHASES, "summary"))
    p.add_argument("--out", required=True)
    p.add_argument("--cpu", action="store_true", help="tiny sizes on CPU (checks the check)")
    args = p.parse_args(argv)
    out = Path(args.out)
    (out / "phases").mkdir(parents=True, exist_ok=True)
    if args.phase == "summary":
        return 0 if summary(out)["ok"] else 1
    result = PHASE_FUNCTIONS[args.phase](out, args.cpu)
    (out / "phases" / f"{args.phase}.json").write_text(json.dumps(result, indent=1, default=str) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
