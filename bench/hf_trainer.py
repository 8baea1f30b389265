"""The whole training loop against the peer a user would otherwise pick: albert_dist's trainer vs transformers'
`Trainer` (DDP over gloo), 2 CPU ranks each, the same model, global batch and steps, taking turns in one run.

    python bench/hf_trainer.py                        # 120 steps, samples/s over steps 20-120, 2 repeats each
    python bench/hf_trainer.py --steps 300 --repeats 1 --out runs/hf-trainer   # keeps the runs
    python bench/run_all.py --only hf_trainer         # as `make bench` runs it

**Ours**: ``python -m albert_dist.cli train`` on the quickstart recipe (configs/pretrain/albert-tiny-wikitext.yaml:
albert-tiny, 2 ranks x 16 sequences of 128 tokens, ZeRO-2, MLM + SOP, 30% masked), its ranks started here with
torchrun's env:// variables (`albert_dist.distributed.local_ranks.local_rank_env`: what `make pretrain`'s launcher
sets, without its own processes), a checkpoint every ``curve_every`` steps and no validation set (the curve is
scored here). **Peer**: transformers' ``Trainer`` (``TrainingArguments(use_cpu=True, ddp_backend="gloo")``, the
same 2 ranks x 16) on ``AlbertForMaskedLM`` with the trainer's initial weights (the recipe's seed, through
``albert_dist.model.hf.to_transformers``), run_mlm's data (every line as ``[CLS] line [SEP]``, concatenated, cut
into 128-token blocks: bench/convergence/convergence.py ``grouped_blocks``) and collator (15% masked), the
recipe's AdamW lr / weight decay / betas / eps, linear warmup and decay, clipping, and one loader worker, as ours;
the Trainer's defaults otherwise (DDP's find_unused_parameters=True among them: what a user gets).

**Samples/s** over steps (``warmup``, ``steps``]: global batch x (steps - warmup) / the training seconds between
the end of step ``warmup`` and the end of the last step, scoring and checkpointing left out (ours: the trainer's
per-interval seconds in metrics.jsonl; the peer: a callback's clock on rank 0 at every step end, less the time
its scoring took). The first steps (start-up, lazy allocations) are not counted. **Time to accuracy**: every
``curve_every`` steps each model is scored by one function on one held-out set (convergence.py's ``score`` on
``scoring_set``: validation blocks masked once at 15%, seed 1234); the target is the lower of the two final
accuracies (both reach it), and each side's figure is the training seconds to its first curve point at or above
it. Runs alternate (ours, peer, peer, ours, ...) so that a change of the machine's load falls on both; the load
average before and after each run is recorded (``os.getloadavg``), since on shared cores it moves every figure.

``run(...)`` returns the figures for bench/run_all.py; ``main`` also writes them to bench/results/hf_trainer.json.
"""
from __future__ import annotations

import argparse
import json
import logging
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Optional, Sequence

BENCH = Path(__file__).resolve().parent
ROOT = BENCH.parent
sys.path.insert(0, str(BENCH / "convergence"))
sys.path.insert(0, str(BENCH))
import convergence as conv  # noqa: E402
from _common import stats  # noqa: E402

from albert_dist.distributed.env import free_port  # noqa: E402
from albert_dist.distributed.local_ranks import local_rank_env  # noqa: E402

log = logging.getLogger("bench.hf_trainer")
RECIPE = ROOT / "configs" / "pretrain" / "albert-tiny-wikitext.yaml"
RANKS = 2
RESULTS = BENCH / "results" / "hf_trainer.json"
#: Held-out blocks scored per curve point (200: ~4k masked tokens, a few seconds on one loaded core).
SCORE_BLOCKS = 200


# --------------------------------------------------------------------------------------------- pure parts
def order(repeats: int) -> list[str]:
    """The runs in the order they take turns: ours, peer, then peer, ours, ... (each pair mirrors the last, so a
    load that rises or falls over the run weighs on both sides alike)."""
    pairs = [("ours", "peer") if i % 2 == 0 else ("peer", "ours") for i in range(repeats)]
    return [side for pair in pairs for side in pair]


def samples_per_s(step_s: dict[int, float], warmup: int, steps: int, global_batch: int) -> float:
    """Samples/s over steps (``warmup``, ``steps``] from cumulative training seconds at step ends (``step_s``:
    step -> seconds since the start, scoring and checkpoints left out).

    Raises:
        KeyError: ``warmup`` or ``steps`` was not timed.
    """
    return global_batch * (steps - warmup) / (step_s[steps] - step_s[warmup])


def time_to_target(curves: dict[str, list[dict[str, float]]]) -> dict[str, Any]:
    """The accuracy both sides reach (the lower of their last curve points' ``mlm_accuracy``) and each side's
    training seconds (and step) to its first curve point at or above it; ``ratio_peer_over_ours`` of the seconds."""
    target = min(curve[-1]["mlm_accuracy"] for curve in curves.values())
    out: dict[str, Any] = {"target_mlm_accuracy": target}
    for side, curve in curves.items():
        hit = conv.time_to(curve, target)
        out[f"{side}_steps"], out[f"{side}_train_s"] = hit["steps"], hit["train_s"]
    out["ratio_peer_over_ours"] = out["peer_train_s"] / out["ours_train_s"]
    return out


# --------------------------------------------------------------------------------------------- ours
def _start(cmd: list[str], logs: Path, env: Optional[dict[str, str]] = None) -> list[subprocess.Popen]:
    """``cmd`` as ranks 0..RANKS-1 of one job on this machine (env:// variables, one thread each), output to
    ``logs/rank<r>.log``."""
    port = free_port()
    base = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), *filter(None, [os.environ.get("PYTHONPATH")])]),
            **(env or {})}
    return [subprocess.Popen(cmd, cwd=ROOT, env={**base, **local_rank_env(r, RANKS, port)},
                             stdout=open(logs / f"rank{r}.log", "wb"), stderr=subprocess.STDOUT)
            for r in range(RANKS)]


def _wait(ranks: list[subprocess.Popen], logs: Path, timeout_s: float, what: str) -> None:
    deadline = time.monotonic() + timeout_s
    try:
        for rank in ranks:
            rank.wait(timeout=max(1.0, deadline - time.monotonic()))
    except subprocess.TimeoutExpired:
        raise RuntimeError(f"{what} did not finish within {timeout_s:.0f} s") from None
    finally:
        for rank in ranks:
            if rank.poll() is None:
                rank.kill()
                rank.wait()
    codes = [rank.returncode for rank in ranks]
    if any(codes):
        tail = (logs / "rank0.log").read_text(errors="replace")[-3000:]
        raise RuntimeError(f"{what} exited {codes}:\n{tail}")


def run_ours(work: Path, steps: int, warmup: int, curve_every: int, cfg, scoring: dict[str, Any],
             timeout_s: float) -> dict[str, Any]:
    """One run of albert_dist's trainer (module docstring): samples/s, its scored curve, wall seconds."""
    import math

    run_dir = work / "run"
    log_every = math.gcd(warmup, curve_every)
    cmd = [sys.executable, "-m", "albert_dist.cli", "train", "--config", str(RECIPE), f"run_dir={run_dir}",
           f"max_steps={steps}", f"log_interval_steps={log_every}", f"eval_interval_steps={steps}",
           f"checkpoint.save_interval_steps={curve_every}", f"checkpoint.keep_last={steps // curve_every + 1}",
           "data.validation=[]", "tracking.enabled=false", "progress_bar=false"]
    start = time.perf_counter()
    _wait(_start(cmd, work), work, timeout_s, "albert_dist's trainer")
    wall = time.perf_counter() - start
    train_s, _ = conv.read_metrics(str(run_dir), cfg.engine.train_micro_batch_size_per_gpu * RANKS)
    curve = conv.score_run(cfg, str(run_dir), scoring)
    return {"samples_per_s": samples_per_s(train_s, warmup, steps, _global_batch(cfg)), "curve": curve,
            "wall_s": wall}


# --------------------------------------------------------------------------------------------- the peer
def run_peer(work: Path, steps: int, warmup: int, curve_every: int, cfg, timeout_s: float) -> dict[str, Any]:
    """One run of transformers' Trainer (module docstring; its ranks run `_peer_rank`): samples/s, its scored
    curve, wall seconds."""
    out = work / "peer.json"
    cmd = [sys.executable, str(Path(__file__).resolve()), "--peer-rank", str(out), "--steps", str(steps),
           "--curve-every", str(curve_every), "--work", str(work)]
    start = time.perf_counter()
    _wait(_start(cmd, work), work, timeout_s, "transformers' Trainer")
    wall = time.perf_counter() - start
    result = json.loads(out.read_text())
    step_s = {int(k): v for k, v in result["step_s"].items()}
    return {"samples_per_s": samples_per_s(step_s, warmup, steps, _global_batch(cfg)), "curve": result["curve"],
            "wall_s": wall}


def _global_batch(cfg) -> int:
    return cfg.engine.train_micro_batch_size_per_gpu * cfg.engine.gradient_accumulation_steps * RANKS


def _peer_rank(out: Path, steps: int, curve_every: int, work: Path) -> None:
    """One rank of the peer job (env:// variables set by `_start`): transformers' Trainer on the recipe's model,
    data and optimiser settings; rank 0 writes its clock and scored curve to ``out``."""
    import torch
    from torch.utils.data import Dataset
    from transformers import (AlbertForMaskedLM, DataCollatorForLanguageModeling, Trainer, TrainerCallback,
                              TrainingArguments)

    from albert_dist.config import load_config
    from albert_dist.engine.checkpoint.state import seed_all
    from albert_dist.model import AlbertForPreTraining
    from albert_dist.model.hf import to_transformers

    torch.set_num_threads(1)
    rank = int(os.environ["RANK"])
    cfg = load_config(RECIPE)
    seed_all(cfg.seed)  # the trainer's initial weights
    start = to_transformers(AlbertForPreTraining(cfg.model))
    model = AlbertForMaskedLM(start.config)
    missing, _ = model.load_state_dict(start.state_dict(), strict=False)  # the pooler and SOP head are left out
    assert not [k for k in missing if "decoder" not in k], missing  # the decoder is tied to the embeddings
    model.tie_weights()
    blocks = conv.grouped_blocks(conv.train_files(cfg), cfg.data.tokenizer_path, cfg.data.max_seq_length)

    class Blocks(Dataset):
        def __len__(self) -> int:
            return len(blocks)

        def __getitem__(self, i: int) -> dict[str, Any]:
            return {"input_ids": blocks[i]}

    scoring = conv.scoring_set(cfg, max_blocks=SCORE_BLOCKS) if rank == 0 else None
    step_s: dict[int, float] = {}
    curve: list[dict[str, float]] = []

    class Clock(TrainerCallback):
        """Rank 0: training seconds at every step end (scoring left out), the curve every ``curve_every``."""

        def __init__(self) -> None:
            self.start, self.paused = None, 0.0

        def on_train_begin(self, args, state, control, **kwargs):
            self.start = time.perf_counter()

        def on_step_end(self, args, state, control, model=None, **kwargs):
            if rank != 0:
                return
            now = time.perf_counter()
            step_s[state.global_step] = now - self.start - self.paused
            if state.global_step % curve_every == 0 or state.global_step == steps:
                curve.append({"step": state.global_step, "train_s": step_s[state.global_step],
                              **conv.score(model, scoring)})
                model.train()
                self.paused += time.perf_counter() - now

    opt = cfg.optimizer
    args = TrainingArguments(
        output_dir=str(work / "peer-out"), per_device_train_batch_size=cfg.engine.train_micro_batch_size_per_gpu,
        gradient_accumulation_steps=cfg.engine.gradient_accumulation_steps, max_steps=steps,
        learning_rate=opt.lr, weight_decay=opt.weight_decay, adam_beta1=opt.betas[0], adam_beta2=opt.betas[1],
        adam_epsilon=opt.eps, warmup_steps=opt.warmup_steps_for(steps), lr_scheduler_type="linear",
        max_grad_norm=cfg.engine.gradient_clipping, logging_steps=steps, save_strategy="no", eval_strategy="no",
        report_to="none", use_cpu=True, ddp_backend="gloo", dataloader_num_workers=cfg.data.num_workers,
        dataloader_drop_last=True, seed=cfg.seed, disable_tqdm=True)
    collator = DataCollatorForLanguageModeling(conv._hf_tokenizer(cfg.data.tokenizer_path), mlm_probability=0.15)
    Trainer(model=model, args=args, train_dataset=Blocks(), data_collator=collator, callbacks=[Clock()]).train()
    if rank == 0:
        out.write_text(json.dumps({"step_s": step_s, "curve": curve}))


# --------------------------------------------------------------------------------------------- the benchmark
def run(repeats: int = 2, steps: int = 120, warmup: int = 20, curve_every: int = 40,
        timeout_s: float = 600.0, out: Optional[str] = None) -> dict[str, Any]:
    """Ours and the peer, ``repeats`` runs each taking turns (`order`); per repeat: samples/s of each over steps
    (``warmup``, ``steps``] and their ratio, time to the common accuracy (`time_to_target`) and its ratio; the
    load average around each run. ``out``: keep the runs there (default: a temporary folder, removed)."""
    from albert_dist.config import load_config

    if not 0 < warmup < steps or steps % curve_every:
        raise ValueError(f"need 0 < warmup < steps and steps a multiple of curve_every, got warmup={warmup}, "
                         f"steps={steps}, curve_every={curve_every}")
    cfg = load_config(RECIPE)
    scoring = conv.scoring_set(cfg, max_blocks=SCORE_BLOCKS)
    root = Path(out) if out else Path(tempfile.mkdtemp(prefix="bench-hf-trainer-"))
    runs: dict[str, list[dict[str, Any]]] = {"ours": [], "peer": []}
    try:
        for i, side in enumerate(order(repeats)):
            work = root / f"{i}-{side}"
            shutil.rmtree(work, ignore_errors=True)
            work.mkdir(parents=True)
            load_before = os.getloadavg()[0]
            log.info("%s run %d of %d (load average %.1f)", side, len(runs[side]) + 1, repeats, load_before)
            result = (run_ours(work, steps, warmup, curve_every, cfg, scoring, timeout_s) if side == "ours"
                      else run_peer(work, steps, warmup, curve_every, cfg, timeout_s))
            result["load_average"] = [load_before, os.getloadavg()[0]]
            log.info("%s: %.1f samples/s, curve %s", side, result["samples_per_s"],
                     [(p["step"], round(p["mlm_accuracy"], 4)) for p in result["curve"]])
            runs[side].append(result)
    finally:
        if not out:
            shutil.rmtree(root, ignore_errors=True)
    ratio = [o["samples_per_s"] / p["samples_per_s"] for o, p in zip(runs["ours"], runs["peer"])]
    tta = [time_to_target({"ours": o["curve"], "peer": p["curve"]}) for o, p in zip(runs["ours"], runs["peer"])]
    loads = [x for side in runs.values() for r in side for x in r["load_average"]]
    return {
        "ours_samples_per_s": [r["samples_per_s"] for r in runs["ours"]],
        "peer_samples_per_s": [r["samples_per_s"] for r in runs["peer"]],
        "ratio_samples_per_s_ours_over_peer": ratio,
        "time_to_accuracy": tta,
        "ratio_time_to_accuracy_peer_over_ours": [t["ratio_peer_over_ours"] for t in tta],
        "ours_wall_s": [r["wall_s"] for r in runs["ours"]], "peer_wall_s": [r["wall_s"] for r in runs["peer"]],
        "curves": {side: [r["curve"] for r in rs] for side, rs in runs.items()},
        "load_average": {"min": min(loads), "max": max(loads)},
        "sizes": {"ranks": RANKS, "global_batch": _global_batch(cfg), "seq": cfg.data.max_seq_length,
                  "steps": steps, "timed_steps": [warmup + 1, steps], "curve_every": curve_every,
                  "repeats": repeats, "score_blocks": SCORE_BLOCKS, "model": "albert-tiny"},
    }


def summary(result: dict[str, Any]) -> str:
    """The result in a few lines (what `main` prints and the README quotes)."""
    ratio, tta = stats(result["ratio_samples_per_s_ours_over_peer"]), stats(result["ratio_time_to_accuracy_peer_over_ours"])
    ours, peer = stats(result["ours_samples_per_s"]), stats(result["peer_samples_per_s"])
    s, load = result["sizes"], result["load_average"]
    target = stats(t["target_mlm_accuracy"] for t in result["time_to_accuracy"])
    return (f"albert_dist vs transformers' Trainer (DDP, gloo), {s['ranks']} CPU ranks, {s['model']}, global batch "
            f"{s['global_batch']} x {s['seq']}, steps {s['timed_steps'][0]}-{s['timed_steps'][1]}, {s['repeats']} "
            f"runs each alternated, load average {load['min']:.1f}-{load['max']:.1f}:\n"
            f"  samples/s: ours {ours['min']:.1f}-{ours['max']:.1f}, Trainer {peer['min']:.1f}-{peer['max']:.1f}; "
            f"ratio {ratio['min']:.2f}-{ratio['max']:.2f}x\n"
            f"  time to val MLM accuracy {target['min']:.3f}-{target['max']:.3f} (the lower final of each pair): "
            f"Trainer / ours {tta['min']:.2f}-{tta['max']:.2f}x")


def main(argv: Optional[Sequence[str]] = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--repeats", type=int, default=2)
    p.add_argument("--steps", type=int, default=120)
    p.add_argument("--warmup", type=int, default=20, help="steps not timed (samples/s over (warmup, steps])")
    p.add_argument("--curve-every", type=int, default=40)
    p.add_argument("--timeout-s", type=float, default=600.0, help="limit of each run (s)")
    p.add_argument("--out", default=None, help="keep the runs in this folder")
    p.add_argument("--results", default=str(RESULTS), help="write the result here ('' = no file)")
    p.add_argument("--peer-rank", default=None, help=argparse.SUPPRESS)  # a rank of the peer job (run_peer)
    p.add_argument("--work", default=None, help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.peer_rank:
        _peer_rank(Path(args.peer_rank), args.steps, args.curve_every, Path(args.work))
        return 0
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    command = "python bench/hf_trainer.py" + "".join(f" {a}" for a in (argv if argv is not None else sys.argv[1:]))
    result = run(args.repeats, args.steps, args.warmup, args.curve_every, args.timeout_s, out=args.out)
    result["command"] = command
    result["date_utc"] = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    print(summary(result))
    if args.results:
        Path(args.results).write_text(json.dumps(result, indent=1) + "\n")
        print(f"wrote {args.results}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
