"""docs/scale-*.md's sizing tables for 8, 64 and 512 GPUs, from measured figures (not a suite benchmark).

Prints Markdown tables; every number comes from a measurement named beside it or from a formula those
measurements check:

* memory per rank: `albert_dist.engine.memory` (checked cell by cell against DeepSpeed's tensors and torch's
  profiler by bench/memory_scale.py; its figures are in bench/results/memory_scale.json);
* data workers per rank: the data pipeline's tokens per CPU-second of one core (`data_pipeline` in
  bench/results/results.json, from `make bench`) against what a GPU consumes at an assumed MFU (`--mfu`, `--peak-tflops`;
  no GPU has measured ALBERT here yet: bench/gpu_check.sh will), from `albert_dist.model.flops`;
* checkpoint bytes and save time per rank: `bench/checkpoint_io.py`'s engine save of each preset on this machine
  (1 rank: bytes on disk and seconds, so MB/s), split per rank as DeepSpeed writes it (rank 0: the module's
  weights; every rank: its fp32 master + Adam partition), checked against the measured 1-rank total;
* MLflow volume per 1,000 steps: the soak's counts (`--soak soak.json` from `python bench/soak.py --json ...`).

    python bench/sizing.py --soak bench/results/soak.json          # measures the checkpoints (3.5 min at load 5-6), reads the soak
    python bench/sizing.py --no-checkpoints                # memory and data tables only
    python bench/sizing.py --only memory                   # one table (memory, data, checkpoints, mlflow)
"""
from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path
from typing import Any, Optional

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

PRESETS = ("albert-base", "albert-large", "albert-xlarge", "albert-xxlarge")
WORLDS = (8, 64, 512)
GPUS_PER_NODE = 8


def _gib(n: float) -> str:
    return f"{n / 2**30:.2f} GiB" if n >= 2**30 else f"{n / 2**20:.1f} MiB"


def _cfg(preset: str, *overrides: str):
    from albert_dist.config import load_config

    return load_config(None, [f"model.preset={preset}", *overrides])


def memory_tables(precision: str = "bf16", seq: int = 512, micro_batch: int = 32) -> str:
    from albert_dist.engine import memory
    from albert_dist.model.sharing import parameter_count

    lines = [f"Model states per rank ({precision}: parameters + gradients + fp32 master + Adam moments), DeepSpeed's "
             "gradient bucket at its default size, ZeRO-3's gathered parameters:", "",
             "| preset | parameters | ZeRO | " + " | ".join(f"{w} GPUs" for w in WORLDS) + " | bucket | ZeRO-3 gathered |",
             "|" + "---|" * (5 + len(WORLDS))]
    for preset in PRESETS:
        for stage in (1, 2, 3):
            cfg = _cfg(preset, f"engine.zero_stage={stage}", f"engine.precision={precision}")
            ests = [memory.model_state_bytes(cfg.model, cfg.engine, w) for w in WORLDS]
            lines.append(f"| {preset} | {parameter_count(cfg.model) / 1e6:.1f} M | {stage} | "
                         + " | ".join(_gib(e.model_states_bytes) for e in ests)
                         + f" | {_gib(ests[0].buffers_bytes)} | {_gib(ests[-1].gathered_bytes) if stage == 3 else '—'} |")
    lines += ["", f"Activations ({precision}, sequences of {seq} tokens, ALBERT's 20 predictions per sequence): saved per "
              f"sequence, the peak of a micro-batch of 1 and of {micro_batch}, against the model states of ZeRO-2 on 8 "
              "GPUs:", "", f"| preset | checkpointing | saved per sequence | peak, micro-batch 1 | peak, micro-batch "
              f"{micro_batch} | model states (ZeRO-2, 8 GPUs) | activations / model states |", "|---|---|---|---|---|---|---|"]
    for preset in PRESETS:
        for ckpt in (False, True):
            cfg = _cfg(preset, "engine.zero_stage=2", f"engine.precision={precision}",
                       f"model.gradient_checkpointing={str(ckpt).lower()}", f"data.max_seq_length={seq}")
            masked = memory.masked_positions(cfg.data, seq)
            one = memory.activation_bytes(cfg.model, 1, seq, precision, masked=masked)
            many = memory.activation_bytes(cfg.model, micro_batch, seq, precision, masked=masked)
            states = memory.model_state_bytes(cfg.model, cfg.engine, 8).model_states_bytes
            lines.append(f"| {preset} | {'yes' if ckpt else 'no'} | {_gib(one.retained_bytes)} | {_gib(one.peak_bytes)} | "
                         f"{_gib(many.peak_bytes)} | {_gib(states)} | {many.peak_bytes / states:.0f}x |")
    return "\n".join(lines)


def data_table(results: Path, mfu: float, peak_tflops: float, seq: int = 512) -> str:
    from albert_dist.engine.memory import masked_positions
    from albert_dist.model.flops import mlm_head_training_flops_per_prediction, training_flops_per_token

    bench = json.loads(results.read_text())
    s = bench["benchmarks"]["data_pipeline"]["summary"]["ours_tokens_per_s"]
    per_core = s["min"]  # the slowest repeat: a worker must keep up in its worst second
    m = bench["machine"]
    lines = [f"Data pipeline, one core, sequence {seq}: {s['min']:,.0f} / {s['median']:,.0f} / {s['max']:,.0f} tokens per "
             f"CPU-second (min / median / max, `data_pipeline` in bench/results/results.json, {m['cpu_model']}, "
             f"{m['date_utc'][:10]}); sized with the minimum. A GPU's appetite at an assumed {mfu:.0%} MFU of "
             f"{peak_tflops:g} TFLOP/s (training FLOPs per token from albert_dist.model.flops, MLM head at 20 "
             "predictions per sequence); workers per rank = ceil(appetite / per-core rate x 2) (a worker at half a "
             "core leaves room for the rank's own thread, tokenizer spikes and a shared node):", "",
             "| preset | training FLOPs per token | tokens/s per GPU (assumed MFU) | cores of data pipeline per GPU | "
             "loader workers per rank | tokens/s for " + ", ".join(f"{w}" for w in WORLDS) + " GPUs |", "|---|---|---|---|---|---|"]
    for preset in PRESETS:
        cfg = _cfg(preset, f"data.max_seq_length={seq}")
        flops = training_flops_per_token(cfg.model, seq) + \
            mlm_head_training_flops_per_prediction(cfg.model) * masked_positions(cfg.data, seq) / seq
        rate = mfu * peak_tflops * 1e12 / flops
        cores = rate / per_core
        lines.append(f"| {preset} | {flops / 1e9:.2f} GFLOP | {rate:,.0f} | {cores:.2f} | {max(1, math.ceil(cores * 2))} | "
                     + ", ".join(f"{rate * w / 1e6:,.1f} M" for w in WORLDS) + " |")
    return "\n".join(lines)


def checkpoint_table(presets: tuple[str, ...] = ("albert-base", "albert-large", "albert-xlarge"), repeats: int = 2,
                     precision: str = "bf16") -> str:
    import checkpoint_io

    from albert_dist.model.sharing import parameter_count

    measured = checkpoint_io.run(repeats=repeats, presets=presets)
    lines = ["Checkpoint of one rank measured here (`bench/checkpoint_io.py`'s DeepSpeed engine save, ZeRO-2, fp32, "
             "1 rank, local disk, page cache warm) and split per rank as DeepSpeed writes it: rank 0 the module's weights "
             "(`mp_rank_00_model_states.pt`, the precision's bytes), every rank its fp32 master + Adam partition "
             "(`zero_pp_rank_*_optim_states.pt`, 12 bytes per parameter / N); save time per rank at this machine's "
             "measured write rate (a shared file system divides its bandwidth among the ranks writing at once):", "",
             "| preset | measured 1 rank: bytes (formula) | save s | MB/s | per rank at 8 / 64 / 512 GPUs (rank 0 adds "
             f"the {precision} weights) | save s per rank at 8 / 64 / 512 | whole checkpoint |", "|---|---|---|---|---|---|---|"]
    w = {"fp32": 4, "bf16": 2}[precision]
    for preset in presets:
        p = measured[preset]
        n = parameter_count(_cfg(preset).model)
        formula_1 = 4 * n + 12 * n  # the measured run is fp32 on 1 rank
        save_s = sorted(p["deepspeed_save_s"])[len(p["deepspeed_save_s"]) // 2]
        rate = p["deepspeed_bytes"] / save_s
        per_rank = [12 * n / g for g in WORLDS]
        lines.append(f"| {preset} | {p['deepspeed_bytes'] / 1e6:.0f} MB ({formula_1 / 1e6:.0f} MB) | {save_s:.2f} | "
                     f"{rate / 1e6:.0f} | " + " / ".join(f"{b / 1e6:.1f} MB" for b in per_rank)
                     + f" (+ {w * n / 1e6:.0f} MB) | " + " / ".join(f"{b / rate:.3f}" for b in per_rank)
                     + f" (rank 0 + {w * n / rate:.2f}) | {(w * n + 12 * n) / 1e6:.0f} MB |")
    return "\n".join(lines)


def mlflow_table(soak: dict[str, Any]) -> str:
    a = soak["analysis"]
    rows, sys_rows = a["mlflow_metric_rows_per_1000_steps"], a["mlflow_system_metric_rows_per_hour"]
    db = a["mlflow_db_bytes_per_1000_steps"]
    lines = [f"From the soak ({soak.get('steps_done', soak['steps'])} steps, {soak['ranks']} ranks, log every 50 steps, validation every 250; "
             f"{soak['wall_s'] / 60:.0f} min): {rows:.0f} training/validation metric rows per 1,000 steps, "
             f"{sys_rows:.0f} system-metric rows per hour per node, SQLite {db / 1e6:.2f} MB per 1,000 steps; checkpoint "
             "artifacts bounded by `tracking.keep_last_checkpoints` (= `checkpoint.keep_last`). Training rows do not "
             "grow with the ranks (one record per log step, per-rank memory series up to 8 ranks: "
             "`mem/peak_gib_rank<r>`, then only max/min); system metrics come from every node:", "",
             "| GPUs (8 per node) | training rows per 1,000 steps | system rows per hour | system rows per 1,000 steps at "
             "1 s per step |", "|---|---|---|---|"]
    per_rank_series = 1  # mem/peak_gib_rank<r> per logged step for each rank up to 8; the soak had 2
    per_log = rows / (1000 / 50)
    for g in WORLDS:
        nodes = max(1, g // GPUS_PER_NODE)
        extra = (min(g, 8) - soak["ranks"]) * per_rank_series * (1000 / 50)
        lines.append(f"| {g} | {rows + extra:.0f} | {sys_rows * nodes:,.0f} | {sys_rows * nodes * 1000 / 3600:,.0f} |")
    lines.append("")
    lines.append(f"({per_log:.1f} rows per logged step in the soak.)")
    return "\n".join(lines)


def main(argv: Optional[list[str]] = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--soak", help="JSON of `python bench/soak.py --json`")
    p.add_argument("--results", default=str(ROOT / "bench" / "results" / "results.json"))
    p.add_argument("--mfu", type=float, default=0.4)
    p.add_argument("--peak-tflops", type=float, default=989.0, help="dense bf16 peak of one GPU (H100 SXM: 989)")
    p.add_argument("--no-checkpoints", action="store_true", help="skip the checkpoint measurement")
    p.add_argument("--only", choices=("memory", "data", "checkpoints", "mlflow"), help="print this table only")
    a = p.parse_args(argv)
    import logging

    logging.basicConfig(level=logging.WARNING)
    if a.only in (None, "memory"):
        print(memory_tables(), "\n")
    if a.only in (None, "data"):
        print(data_table(Path(a.results), a.mfu, a.peak_tflops), "\n")
    if a.only == "checkpoints" or (a.only is None and not a.no_checkpoints):
        print(checkpoint_table(), "\n")
    if a.soak and a.only in (None, "mlflow"):
        print(mlflow_table(json.loads(Path(a.soak).read_text())))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
