"""Training-step throughput: albert_dist's AlbertForPreTraining vs transformers' (SDPA), same run, same weights.

One step = forward + backward + AdamW on ALBERT-base (configs/model/albert-base.yaml), B=8, S=128, fp32, CPU,
realistic inputs (a little right padding, 20 MLM predictions per sequence as in ALBERT's
max_predictions_per_seq, SOP labels). The two models alternate step by step so that drift in the shared
machine hits both. Prints tokens/s (min / median / max), the ratio ours / transformers (target >= 1.15), and
the achieved model FLOP/s against a fp32 matmul peak measured in the same run (MFU).

Time is the process CPU time (`time.process_time`) as well as wall time: on a shared machine other processes
stretch the wall time of whichever step they overlap, while a single-threaded step's CPU time stays close to
its cost. The ratio and MFU use CPU time; wall-time figures are printed beside them. The matmul peak is the
best CPU time of a 2048^3 matmul from ``torch.utils.benchmark`` (`_common.cpu_seconds`).

    python bench/model_step.py [--repeats 3] [--threads 1]

`run(repeats=..., threads=...)` returns the figures as a dict for a suite runner.
"""
from __future__ import annotations

import argparse
import statistics
import time
from pathlib import Path

import torch
from _common import cpu_seconds, stats, synthetic_batch

from albert_dist.config import load_model_config
from albert_dist.model import AlbertForPreTraining
from albert_dist.model.flops import mlm_head_training_flops_per_prediction, training_flops_per_token
from albert_dist.model.hf import to_transformers

CONFIG = Path(__file__).resolve().parents[1] / "configs" / "model" / "albert-base.yaml"
BATCH, SEQ, PREDICTIONS = 8, 128, 20


def matmul_peak_flops(n: int = 2048) -> float:
    """Best fp32 FLOP/s (per CPU second) of an n x n x n matmul on this machine (2 n^3 FLOPs)."""
    a, b = torch.randn(n, n), torch.randn(n, n)
    return 2 * n**3 / cpu_seconds(lambda: torch.mm(a, b), min_run_time=2.0)


def run(repeats: int = 3, threads: int = 1) -> dict[str, float]:
    """Time `repeats` steps of each model after one warm-up step; returns tokens/s stats, ratio and MFU.

    Keys: ``{ours,hf}_tokens_per_s_{min,median,max}`` (per CPU second), ``{ours,hf}_wall_tokens_per_s_median``,
    ``{ours,hf}_flops_per_s``, ``{ours,hf}_mfu``, ``matmul_peak_flops``, ``model_flops_per_step``,
    ``ratio_ours_over_hf`` (CPU time) and ``wall_ratio_ours_over_hf``.
    """
    torch.set_num_threads(threads)
    torch.manual_seed(0)
    config = load_model_config(CONFIG)
    ours = AlbertForPreTraining(config).train()
    hf = to_transformers(ours).train()
    batch = synthetic_batch(config.vocab_size, BATCH, SEQ, PREDICTIONS, padded=True)
    hf_batch = dict(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"],
                    token_type_ids=batch["token_type_ids"], labels=batch["mlm_labels"],
                    sentence_order_label=batch["sop_labels"])
    opt_ours = torch.optim.AdamW(ours.parameters(), lr=1e-4)
    opt_hf = torch.optim.AdamW(hf.parameters(), lr=1e-4)

    def step_ours() -> None:
        opt_ours.zero_grad(set_to_none=True)
        ours(**batch).loss.backward()
        opt_ours.step()

    def step_hf() -> None:
        opt_hf.zero_grad(set_to_none=True)
        hf(**hf_batch).loss.backward()
        opt_hf.step()

    peak = matmul_peak_flops()
    times: dict[str, list[float]] = {"ours": [], "hf": []}
    walls: dict[str, list[float]] = {"ours": [], "hf": []}
    # Timed by hand, not with torch.utils.benchmark: its Timer runs the statement more times to warm up and to
    # size blocks, and each run of a training step changes the weights; the models alternate step by step.
    for i in range(repeats + 1):
        for name, step in (("ours", step_ours), ("hf", step_hf)):
            t0, w0 = time.process_time(), time.perf_counter()
            step()
            if i:  # the first round is warm-up
                times[name].append(time.process_time() - t0)
                walls[name].append(time.perf_counter() - w0)
    peak = max(peak, matmul_peak_flops())

    tokens = BATCH * SEQ
    n_pred = int((batch["mlm_labels"] != -100).sum())
    step_flops = tokens * training_flops_per_token(config, SEQ) + n_pred * mlm_head_training_flops_per_prediction(config)
    result: dict[str, float] = {"matmul_peak_flops": peak, "model_flops_per_step": step_flops}
    for name, ts in times.items():
        tps = stats(tokens / t for t in ts)
        result.update({f"{name}_tokens_per_s_{k}": tps[k] for k in ("min", "median", "max")})
        result[f"{name}_flops_per_s"] = step_flops / statistics.median(ts)
        result[f"{name}_mfu"] = result[f"{name}_flops_per_s"] / peak
        result[f"{name}_wall_tokens_per_s_median"] = tokens / statistics.median(walls[name])
    result["ratio_ours_over_hf"] = result["ours_tokens_per_s_median"] / result["hf_tokens_per_s_median"]
    result["wall_ratio_ours_over_hf"] = (result["ours_wall_tokens_per_s_median"]
                                         / result["hf_wall_tokens_per_s_median"])
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3, help="timed steps per model (after 1 warm-up)")
    parser.add_argument("--threads", type=int, default=1, help="torch intra-op threads")
    args = parser.parse_args()
    r = run(repeats=args.repeats, threads=args.threads)
    print(f"ALBERT-base training step, B={BATCH} S={SEQ} fp32 CPU, {args.threads} thread(s), {args.repeats} repeats")
    for name, label in (("ours", "albert_dist"), ("hf", "transformers (sdpa)")):
        print(f"  {label:<20} tokens per CPU-s min {r[f'{name}_tokens_per_s_min']:7.1f}  median "
              f"{r[f'{name}_tokens_per_s_median']:7.1f}  max {r[f'{name}_tokens_per_s_max']:7.1f}  "
              f"(wall median {r[f'{name}_wall_tokens_per_s_median']:7.1f})  "
              f"model GFLOP/s {r[f'{name}_flops_per_s'] / 1e9:6.1f}  MFU {r[f'{name}_mfu']:.1%}")
    print(f"  matmul peak (fp32 2048^3): {r['matmul_peak_flops'] / 1e9:.1f} GFLOP/s")
    print(f"  ratio ours / transformers (median tokens per CPU-s): {r['ratio_ours_over_hf']:.3f}  (target >= 1.15); "
          f"wall-time ratio {r['wall_ratio_ours_over_hf']:.3f}")


if __name__ == "__main__":
    main()
