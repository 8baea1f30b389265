"""What the model learns per token: albert_dist's trainer vs transformers' run_mlm recipe, at equal tokens.

Ours is the real trainer (``python -m albert_dist.cli train``, one rank, a child process) on the quickstart
recipe (configs/pretrain/albert-tiny-wikitext.yaml) with a checkpoint every ``curve_every`` steps. The peer is
transformers' ``AlbertForPreTraining`` built from the same ``AlbertConfig`` and the same initial weights
(seeded as the trainer seeds, converted by ``albert_dist.model.hf.to_transformers``), trained single-process
as run_mlm trains: every line of the same training files tokenized with the same sentencepiece model as
``[CLS] line [SEP]``, concatenated and cut into ``max_seq_length`` blocks (run_mlm's ``group_texts``, blocks
shuffled every epoch), ``DataCollatorForLanguageModeling(mlm_probability=0.15)``, the MLM loss only, and the
same optimiser, schedule, clipping, global batch and steps (``albert_dist.engine.optim.build_optimizer`` /
``build_scheduler`` on its parameters, ``torch.nn.utils.clip_grad_norm_`` at ``engine.gradient_clipping``).

Both are scored by one function on one held-out set: the validation file grouped the same way into
``max_seq_length`` blocks, masked once by ``DataCollatorForLanguageModeling`` (15%, seed 1234, the same
80/10/10 replacement), scored in transformers (ours through its HF export: DeepSpeed checkpoint ->
``consolidate_fp32`` -> ``to_transformers``). ``unigram`` is the floor of that set: every masked token
predicted from the training corpus' token frequencies (add-one smoothed for the loss).

Recipes of ours (trainer overrides on top of the quickstart recipe, see ``RECIPES``):

* ``matched``: single-token masking (``data.max_ngram=1``, ``data.whole_word_masking=false``), no SOP loss
  (``objective.sop_weight=0``) and no short sequences (``data.short_seq_prob=0``, the peer's blocks are all full
  length): the peer's objective on ALBERT's two-segment examples (bench/convergence/ablations.py cell ``matched_ssp0``;
  cell ``matched`` keeps ALBERT's 10% short sequences).
* ``albert``: ALBERT's recipe: n-gram whole-word masking of 15% of the tokens, ``short_seq_prob`` 0.1, SOP at
  weight 1 from the first step.
* ``albert_mlm_only``: the same with the SOP loss off, the reference of ALBERT's SOP cost.
* ``quickstart``: the quickstart recipe as it is: 30% of single pieces masked, no short sequences, SOP from step 0
  (ablation cell ``shipped_mask30_sop1``).

Figures per recipe: val MLM loss / accuracy at each ``report_steps`` (300 and 1,000 standalone), the ratio
ours / peer of the accuracy there, the whole curve, and **time-to-accuracy**: the first curve step (and the
training wall seconds up to it, evaluation and checkpointing excluded) at which each reaches the peer's
accuracy at the first report step. The ALBERT recipe also reports val SOP accuracy (the trainer's own
validation, ``data.validation`` pairs) and its MLM accuracy over the MLM-only run's. Every point of a 1,000-
step run sees the learning-rate schedule of 1,000 steps (the 300-step point is inside that run, not the end
of a 300-step run).

    python bench/convergence/convergence.py                          # 1,000 steps, points at 300 and 1,000 (~25 min)
    python bench/convergence/convergence.py --steps 200 --report-steps 100 200 --recipes matched
    python bench/convergence/convergence.py --out runs/convergence   # keeps the runs (metrics.jsonl, checkpoints)

``run(...)`` returns the figures as a dict for bench/run_all.py (the suite runs fewer steps, same comparison).
"""
from __future__ import annotations

import argparse
import json
import logging
import math
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Optional, Sequence

from albert_dist.tracking.base import read_metric_log

ROOT = Path(__file__).resolve().parents[2]
RECIPE = ROOT / "configs" / "pretrain" / "albert-tiny-wikitext.yaml"
log = logging.getLogger("bench.convergence")

#: Overrides every run of ours gets: one rank with the whole global batch, no tracking server, a checkpoint
#: (= a curve point) every `curve_every` steps, all of them kept.
COMMON = ("engine.zero_stage=2", "engine.train_micro_batch_size_per_gpu=16", "engine.gradient_accumulation_steps=1", "tracking.enabled=false",
          "progress_bar=false", "data.num_workers=1")
#: BERT's and ALBERT's masking rate, and ModernBERT's (the quickstart recipe's); shared with bench/convergence/ablations.py.
MASK15 = ("data.masked_lm_prob=0.15", "data.max_predictions_per_seq=20")
MASK30 = ("data.masked_lm_prob=0.3", "data.max_predictions_per_seq=40")
#: ALBERT's masking (15% in n-gram whole words, short sequences).
_ALBERT = ("data.max_ngram=3", "data.whole_word_masking=true", "data.short_seq_prob=0.1", *MASK15)
#: Trainer overrides per recipe of ours (see the module docstring).
RECIPES: dict[str, tuple[str, ...]] = {
    "matched": ("data.max_ngram=1", "data.whole_word_masking=false", "data.short_seq_prob=0.0", *MASK15,
                "objective.sop_weight=0"),
    "albert": (*_ALBERT, "objective.sop_weight=1", "objective.sop_start_step=0", "objective.sop_ramp_steps=0"),
    "albert_mlm_only": (*_ALBERT, "objective.sop_weight=0"),
    "quickstart": (),
}
SCORE_SEED = 1234
SCORE_MLM_PROBABILITY = 0.15
#: Blocks of the held-out set (evenly spaced over the validation split): ~23k predictions at seq 128, enough
#: for +-0.005 accuracy (2 standard errors at accuracy 0.15), and ~10 s per scoring on one loaded CPU core.
SCORE_BLOCKS = 1200


# ------------------------------------------------------------------------------------------------ data
def _hf_tokenizer(tokenizer_path: str):
    """transformers' AlbertTokenizer over our sentencepiece model (for the collator: special ids, vocab size)."""
    from transformers import AlbertTokenizer

    tmp = tempfile.mkdtemp(prefix="conv-tok-")
    shutil.copyfile(tokenizer_path, os.path.join(tmp, "spiece.model"))
    # The sentencepiece normaliser already does what it was trained with; transformers must add nothing.
    return AlbertTokenizer.from_pretrained(tmp, do_lower_case=False, keep_accents=True)


def _read_text(path: str) -> str:
    """A whole plain or gzip text file (the downstream corpus data/wikitext-2 is gzip shards)."""
    if str(path).endswith(".gz"):
        import gzip

        with gzip.open(path, "rt", encoding="utf-8") as f:
            return f.read()
    return Path(path).read_text(encoding="utf-8")


def grouped_blocks(paths: Sequence[str], tokenizer_path: str, block: int):
    """run_mlm's ``tokenize`` + ``group_texts``: every non-empty line as ``[CLS] ids [SEP]``, concatenated in
    file order, cut into (N, block) int64 blocks, the remainder dropped. Tokenized by sentencepiece directly
    (the ids the trainer sees; transformers' tokenizer would turn a literal ``<unk>`` in the text into the unk
    id where sentencepiece gives the pieces of ``<unk>``)."""
    import numpy as np
    import torch

    from albert_dist.data.tokenizer import CLS_ID, SEP_ID, load_tokenizer

    sp = load_tokenizer(tokenizer_path)
    lines: list[str] = []
    for path in paths:
        lines.extend(s for s in (line.strip() for line in _read_text(path).splitlines()) if s)
    ids = sp.encode(lines, num_threads=1)
    flat = np.fromiter((t for seq in ids for t in (CLS_ID, *seq, SEP_ID)), dtype=np.int64)
    n = len(flat) // block
    return torch.from_numpy(flat[: n * block].reshape(n, block).copy())


def scoring_set(cfg, seed: int = SCORE_SEED, max_blocks: int = SCORE_BLOCKS) -> dict[str, Any]:
    """The fixed held-out set: validation files grouped into blocks, ``max_blocks`` of them evenly spaced
    (all when there are fewer), masked once (15%, ``seed``)."""
    import torch

    from transformers import DataCollatorForLanguageModeling

    from albert_dist.data.sources.discover import discover_files

    files = [str(f) for i, src in enumerate(cfg.data.validation)
             for f in discover_files(src, f"data.validation[{i}]")]
    blocks = grouped_blocks(files, cfg.data.tokenizer_path, cfg.data.max_seq_length)
    if len(blocks) > max_blocks:
        blocks = blocks[torch.linspace(0, len(blocks) - 1, max_blocks).round().long()]
    collator = DataCollatorForLanguageModeling(_hf_tokenizer(cfg.data.tokenizer_path),
                                               mlm_probability=SCORE_MLM_PROBABILITY, seed=seed)
    batch = collator([{"input_ids": b} for b in blocks])
    return {"input_ids": batch["input_ids"], "labels": batch["labels"], "files": files,
            "predictions": int((batch["labels"] != -100).sum())}


def train_files(cfg) -> list[str]:
    from albert_dist.data.sources.discover import discover_files

    return [str(f) for i, src in enumerate(cfg.data.train) for f in discover_files(src, f"data.train[{i}]")]


def unigram_floor(cfg, scoring: dict[str, Any]) -> dict[str, float]:
    """Loss / accuracy of predicting every masked token of ``scoring`` from the training corpus' frequencies
    of ordinary tokens (add-one smoothed over the vocabulary)."""
    import torch

    from albert_dist.data.tokenizer import FIRST_NORMAL_ID

    train = grouped_blocks(train_files(cfg), cfg.data.tokenizer_path, 1).flatten()
    counts = torch.bincount(train, minlength=cfg.model.vocab_size).double()
    counts[:FIRST_NORMAL_ID] = 0
    logp = torch.log((counts + 1) / (counts + 1).sum())
    labels = scoring["labels"][scoring["labels"] != -100]
    return {"mlm_loss": float(-logp[labels].mean()), "mlm_accuracy": float((labels == counts.argmax()).double().mean())}


# ------------------------------------------------------------------------------------------------ scoring
def mlm_logits(hf_model, input_ids, keep, full: bool = False):
    """(M, V) fp32 MLM logits of a transformers AlbertForPreTraining at the M positions where ``keep`` (B, S)
    is True, inputs without padding, token type 0. ``full=False`` runs the model's own prediction head on the
    kept positions only: the same logits as ``prediction_logits[keep]`` (row-wise head) without the
    (B, S, V) tensor, which costs ~5x the rest of a tiny model's step on CPU."""
    import torch

    kwargs = dict(input_ids=input_ids, attention_mask=torch.ones_like(input_ids),
                  token_type_ids=torch.zeros_like(input_ids))
    if full:
        return hf_model(**kwargs).prediction_logits[keep].float()
    seq = hf_model.albert(**kwargs).last_hidden_state  # (B, S, H)
    return hf_model.predictions(seq[keep]).float()


def score(hf_model, scoring: dict[str, Any], batch_size: int = 64) -> dict[str, float]:
    """MLM loss (mean over predictions, nats) and accuracy of a transformers AlbertForPreTraining on the set."""
    import torch
    import torch.nn.functional as F

    hf_model.eval()
    loss_sum, correct, count = 0.0, 0, 0
    with torch.no_grad():
        for i in range(0, len(scoring["input_ids"]), batch_size):
            ids, labels = scoring["input_ids"][i:i + batch_size], scoring["labels"][i:i + batch_size]
            keep = labels != -100
            logits = mlm_logits(hf_model, ids, keep)
            loss_sum += float(F.cross_entropy(logits, labels[keep], reduction="sum"))
            correct += int((logits.argmax(-1) == labels[keep]).sum())
            count += int(keep.sum())
    return {"mlm_loss": loss_sum / count, "mlm_accuracy": correct / count}


def score_checkpoint(cfg, ckpt_dir: str, tag: str, scoring: dict[str, Any]) -> dict[str, float]:
    """Score a trainer checkpoint through its HF export (consolidated fp32 -> transformers)."""
    from albert_dist.model.hf import to_transformers
    from albert_dist.runs.weights import consolidate_fp32, load_consolidated

    return score(to_transformers(load_consolidated(cfg.model, consolidate_fp32(ckpt_dir, tag))), scoring)


# ------------------------------------------------------------------------------------------------ ours
def train_ours(overrides: Sequence[str], run_dir: str, steps: int, curve_every: int, timeout_s: float,
               recipe: Path = RECIPE, eval_every: Optional[int] = None) -> subprocess.CompletedProcess:
    """Run the real trainer as a child process (one rank), a checkpoint every ``curve_every`` steps and its own
    validation (SOP accuracy) every ``eval_every`` (default: ``curve_every``) and at the end; raises
    RuntimeError when it fails."""
    cmd = [sys.executable, "-m", "albert_dist.cli", "train", "--config", str(recipe), f"run_dir={run_dir}",
           f"max_steps={steps}", f"checkpoint.save_interval_steps={curve_every}",
           f"checkpoint.keep_last={steps // curve_every + 1}", f"eval_interval_steps={eval_every or curve_every}",
           f"log_interval_steps={math.gcd(curve_every, 10)}", *COMMON, *overrides]
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(ROOT)] + [p for p in [os.environ.get("PYTHONPATH")] if p]))
    env.setdefault("OMP_NUM_THREADS", "1")
    log.info("ours: %s", " ".join(cmd[2:]))
    proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=timeout_s)
    if proc.returncode != 0:
        raise RuntimeError(f"trainer exited {proc.returncode}:\n{proc.stderr[-3000:]}")
    return proc


def flat_record(rec: dict) -> dict:
    """A metrics.jsonl record with the trainer's grouped names ("train/loss", "val/mlm_accuracy",
    "perf/samples_per_s") as the flat ones ("loss", "val_mlm_accuracy", "samples_per_s"); flat names pass."""
    return {("val_" + k[4:] if k.startswith("val/") else k.split("/", 1)[-1]): v for k, v in rec.items()}


def read_metrics(run_dir: str, batch: int = 16) -> tuple[dict[int, float], dict[int, dict[str, float]]]:
    """(cumulative training seconds at each logged step, trainer validation records by step).

    Training seconds per log interval: ``interval_s`` when logged, else sequences / ``samples_per_s`` (both
    leave evaluation and checkpointing out); ``batch`` is the global batch (sequences per step)."""
    train_s, val, total, last_step = {}, {}, 0.0, 0
    for rec in read_metric_log(run_dir):  # whole lines only
        rec = flat_record({k: v for k, v in rec.items() if k != "_end"})
        if "interval_s" in rec:
            total += rec["interval_s"]
        elif "samples_per_s" in rec:
            total += (rec["step"] - last_step) * batch / rec["samples_per_s"]
        elif "val_mlm_accuracy" in rec:
            val[rec["step"]] = rec
            continue
        else:
            continue
        train_s[rec["step"]], last_step = total, rec["step"]
    return train_s, val


def score_run(cfg, run_dir: str, scoring: dict[str, Any]) -> list[dict[str, float]]:
    """Curve of one trainer run: every kept checkpoint scored, with its training seconds and trainer val."""
    from albert_dist.engine.checkpoint.layout import step_of

    train_s, val = read_metrics(run_dir, cfg.engine.train_micro_batch_size_per_gpu)
    ckpt_dir = Path(run_dir, "checkpoints")
    curve = []
    for tag in sorted((p.name for p in ckpt_dir.iterdir() if step_of(p.name) is not None), key=step_of):
        step = step_of(tag)
        point = {"step": step, "train_s": train_s.get(step, float("nan")), **score_checkpoint(cfg, str(ckpt_dir), tag, scoring)}
        if step in val:
            point["val_sop_accuracy"] = val[step]["val_sop_accuracy"]
            point["trainer_val_mlm_accuracy"] = val[step]["val_mlm_accuracy"]
        curve.append(point)
    return curve


# ------------------------------------------------------------------------------------------------ peer
def train_peer(cfg, steps: int, curve_every: int, scoring: dict[str, Any],
               full_logits: bool = False) -> list[dict[str, float]]:
    """`train_peer_model`'s scored curve (the model is dropped)."""
    return train_peer_model(cfg, steps, curve_every, scoring, full_logits)[1]


def train_peer_model(cfg, steps: int, curve_every: int, scoring: Optional[dict[str, Any]],
                     full_logits: bool = False):
    """transformers' run_mlm recipe on the same init/data/optimiser (module docstring); its scored curve.

    Returns ``(model, curve)``: the trained transformers ``AlbertForPreTraining`` and its scored curve (empty when
    ``scoring`` is None). ``full_logits=False`` computes the head at the masked positions only (`mlm_logits`): the same loss and
    gradients as run_mlm's full (B, S, V) logits, ~5x less wall time per step on CPU, so the peer's seconds
    are those of the faster variant; True: run_mlm's full logits."""
    import torch
    import torch.nn.functional as F
    from transformers import DataCollatorForLanguageModeling

    from albert_dist.engine.optim import build_optimizer, build_scheduler
    from albert_dist.engine.checkpoint.state import seed_all
    from albert_dist.model import AlbertForPreTraining
    from albert_dist.model.hf import to_transformers

    seed_all(cfg.seed)  # the trainer's initial weights
    model = to_transformers(AlbertForPreTraining(cfg.model)).train()
    optimizer, _ = build_optimizer(model, cfg.optimizer)  # (optimizer, hook after deepspeed.initialize)
    scheduler = build_scheduler(optimizer, cfg.optimizer, steps)
    blocks = grouped_blocks(train_files(cfg), cfg.data.tokenizer_path, cfg.data.max_seq_length)
    collator = DataCollatorForLanguageModeling(_hf_tokenizer(cfg.data.tokenizer_path), mlm_probability=0.15,
                                               seed=cfg.data.seed)
    batch_size = cfg.engine.train_micro_batch_size_per_gpu * cfg.engine.gradient_accumulation_steps
    gen = torch.Generator().manual_seed(cfg.data.seed)
    order, pos = torch.randperm(len(blocks), generator=gen), 0
    curve, train_s = [], 0.0
    for step in range(1, steps + 1):
        t0 = time.perf_counter()
        if pos + batch_size > len(order):  # next epoch, reshuffled (the HF Trainer's sampler)
            order, pos = torch.randperm(len(blocks), generator=gen), 0
        batch = collator([{"input_ids": b} for b in blocks[order[pos:pos + batch_size]]])
        pos += batch_size
        keep = batch["labels"] != -100
        # mean over the batch's predictions, as run_mlm's loss (ignore_index=-100)
        loss = F.cross_entropy(mlm_logits(model, batch["input_ids"], keep, full_logits), batch["labels"][keep])
        loss.backward()
        if cfg.engine.gradient_clipping > 0:
            torch.nn.utils.clip_grad_norm_(model.parameters(), cfg.engine.gradient_clipping)
        optimizer.step()
        scheduler.step()
        optimizer.zero_grad(set_to_none=True)
        train_s += time.perf_counter() - t0
        if scoring is not None and (step % curve_every == 0 or step == steps):
            curve.append({"step": step, "train_s": train_s, **score(model, scoring)})
            model.train()
    return model, curve


# ------------------------------------------------------------------------------------------------ figures
def at_step(curve: list[dict], step: int) -> Optional[dict]:
    return next((p for p in curve if p["step"] == step), None)


def time_to(curve: list[dict], accuracy: float) -> dict[str, Optional[float]]:
    """First curve point reaching ``accuracy``: its step and training seconds (None: never reached)."""
    hit = next((p for p in curve if p["mlm_accuracy"] >= accuracy), None)
    return {"steps": hit["step"] if hit else None, "train_s": hit["train_s"] if hit else None}


def figures(curves: dict[str, list[dict]], report_steps: Sequence[int]) -> dict[str, Any]:
    """Per recipe: loss/accuracy at the report steps, ratios over the peer, time-to-accuracy (see docstring)."""
    peer = curves["peer"]
    first = at_step(peer, report_steps[0])
    target = first["mlm_accuracy"] if first else float("nan")
    out: dict[str, Any] = {"target_accuracy": target, "target": f"peer's accuracy at step {report_steps[0]}"}
    peer_tta = time_to(peer, target)
    for name, curve in curves.items():
        fig: dict[str, Any] = {}
        for s in report_steps:
            p, q = at_step(curve, s), at_step(peer, s)
            if p is None:
                continue
            fig[f"step_{s}"] = {k: p[k] for k in ("mlm_loss", "mlm_accuracy", "val_sop_accuracy", "train_s") if k in p}
            if q is not None and name != "peer":
                fig[f"step_{s}"]["ratio_accuracy_over_peer"] = p["mlm_accuracy"] / q["mlm_accuracy"]
        tta = time_to(curve, target)
        fig["time_to_target"] = tta
        if name != "peer" and tta["steps"] and peer_tta["steps"]:
            fig["ratio_steps_to_target_over_peer"] = tta["steps"] / peer_tta["steps"]
            fig["ratio_s_to_target_over_peer"] = tta["train_s"] / peer_tta["train_s"]
        out[name] = fig
    if "albert" in curves and "albert_mlm_only" in curves:
        for s in report_steps:
            a, b = at_step(curves["albert"], s), at_step(curves["albert_mlm_only"], s)
            if a and b:
                out["albert"][f"step_{s}"]["ratio_accuracy_over_mlm_only"] = a["mlm_accuracy"] / b["mlm_accuracy"]
    return out


def run(steps: int = 1000, report_steps: Sequence[int] = (300, 1000), curve_every: int = 50,
        recipes: Sequence[str] = ("matched", "albert", "albert_mlm_only", "quickstart"), out_dir: Optional[str] = None,
        overrides: Sequence[str] = (), timeout_s: float = 3600.0, peer_full_logits: bool = False,
        score_blocks: int = SCORE_BLOCKS) -> dict[str, Any]:
    """Train the peer and each recipe of ours for ``steps``, score every ``curve_every`` steps, return figures.

    Keys: ``unigram`` (floor of the set), ``predictions`` (masked tokens scored), ``curves`` (per run: step,
    train_s, mlm_loss, mlm_accuracy[, val_sop_accuracy]), and per run the figures of `figures`. ``overrides``
    are extra trainer overrides applied to every run (the peer reads the same config). Raises ValueError for
    an unknown recipe or a report step that is not a curve point.
    """
    from albert_dist.config import load_config

    unknown = sorted(set(recipes) - set(RECIPES))
    if unknown:
        raise ValueError(f"unknown recipes {unknown}; known: {sorted(RECIPES)}")
    report_steps = [s for s in report_steps if s <= steps]
    if not report_steps or any(s % curve_every and s != steps for s in report_steps):
        raise ValueError(f"report steps {report_steps} must be <= steps={steps} and multiples of "
                         f"curve_every={curve_every}")
    base = [*COMMON, f"max_steps={steps}", *overrides]
    cfg = load_config(RECIPE, base)
    if cfg.optimizer.warmup_steps_for(steps) > steps:
        cfg = load_config(RECIPE, [*base, f"optimizer.warmup_steps={max(1, steps // 10)}"])
    # the recipe may give warmup as a ratio: hand ours and the peer the same absolute number of steps
    overrides = [*overrides, f"optimizer.warmup_steps={cfg.optimizer.warmup_steps_for(steps)}"]
    scoring = scoring_set(cfg, max_blocks=score_blocks)
    result: dict[str, Any] = {"steps": steps, "report_steps": list(report_steps), "curve_every": curve_every,
                              "global_batch": cfg.engine.train_micro_batch_size_per_gpu,
                              "max_seq_length": cfg.data.max_seq_length, "predictions": scoring["predictions"],
                              "unigram": unigram_floor(cfg, scoring), "curves": {}}
    work = Path(out_dir) if out_dir else Path(tempfile.mkdtemp(prefix="convergence-"))
    t0 = time.perf_counter()
    try:
        log.info("peer: %d steps", steps)
        result["curves"]["peer"] = train_peer(cfg, steps, curve_every, scoring, peer_full_logits)
        for name in recipes:
            run_dir = work / name
            shutil.rmtree(run_dir, ignore_errors=True)
            train_ours([*overrides, *RECIPES[name]], str(run_dir), steps, curve_every, timeout_s)
            result["curves"][name] = score_run(load_config(RECIPE, [*base, *overrides, *RECIPES[name]]),
                                               str(run_dir), scoring)
            if not out_dir:
                shutil.rmtree(run_dir / "checkpoints", ignore_errors=True)
    finally:
        if not out_dir:
            shutil.rmtree(work, ignore_errors=True)
    result.update(figures(result["curves"], report_steps))
    result["wall_s"] = time.perf_counter() - t0
    return result


#: bench/convergence/ablations.py cell holding the same run as each curve of this benchmark (`--reuse`).
ABLATION_CELLS = {"peer": "peer", "matched": "matched_ssp0", "albert": "sop1", "albert_mlm_only": "sop0",
                  "quickstart": "shipped_mask30_sop1"}


def reuse(ablations_dir: str, seed: int, report_steps: Sequence[int]) -> dict[str, Any]:
    """The figures from bench/convergence/ablations.py runs of the same recipes (same trainer/peer/scoring code, curve points
    every 100 steps there) instead of training again: `ABLATION_CELLS` maps this benchmark's curves to cells."""
    result: dict[str, Any] = {"report_steps": list(report_steps), "curves": {}, "reused_from": ablations_dir,
                              "seed": seed}
    for name, cell in ABLATION_CELLS.items():
        path = Path(ablations_dir, f"{cell}-seed{seed}.json")
        if path.exists():
            rec = json.loads(path.read_text())
            result["curves"][name] = rec["curve"]
            result.update(predictions=rec["predictions"], unigram=rec["unigram"], steps=rec["steps"])
            result.setdefault("overrides", {})[name] = rec["overrides"]
    result.update(figures(result["curves"], report_steps))
    return result


def _print(result: dict[str, Any]) -> None:
    rs = result["report_steps"]
    print(f"held-out set: {result['predictions']} masked tokens; unigram floor "
          f"{result['unigram']['mlm_loss']:.3f} / {result['unigram']['mlm_accuracy']:.3f}")
    print("| run | " + " | ".join(f"{s} steps loss / acc (÷ peer)" for s in rs) +
          f" | steps (s) to {result['target_accuracy']:.3f} | SOP acc |")
    print("|---" * (len(rs) + 3) + "|")
    for name in ("peer", *RECIPES):
        if name not in result:
            continue
        fig, cells = result[name], []
        for s in rs:
            p = fig.get(f"step_{s}")
            ratio = p.get("ratio_accuracy_over_peer") if p else None
            cells.append(f"{p['mlm_loss']:.3f} / {p['mlm_accuracy']:.3f}" + (f" ({ratio:.3f}×)" if ratio else "")
                         if p else "n/a")
        tta = fig["time_to_target"]
        cells.append(f"{tta['steps']} ({tta['train_s']:.0f} s)" if tta["steps"] else "not reached")
        sop = fig.get(f"step_{rs[-1]}", {}).get("val_sop_accuracy")
        cells.append(f"{sop:.3f}" if sop is not None else "")
        print(f"| {name} | " + " | ".join(cells) + " |")


def main(argv: Optional[list[str]] = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--steps", type=int, default=1000)
    p.add_argument("--report-steps", type=int, nargs="+", default=[300, 1000])
    p.add_argument("--curve-every", type=int, default=50)
    p.add_argument("--recipes", nargs="+", default=list(RECIPES), choices=list(RECIPES))
    p.add_argument("--out", default=None, help="keep the runs here (default: a temporary directory)")
    p.add_argument("--peer-full-logits", action="store_true",
                   help="peer computes run_mlm's full (B, S, V) logits (same learning, its true wall time)")
    p.add_argument("--reuse", default=None, metavar="DIR",
                   help="take the curves from bench/convergence/ablations.py results in DIR instead of training")
    p.add_argument("--seed", type=int, default=1, help="with --reuse: the ablation seed to read")
    p.add_argument("--json", default=None, help="write the result dict here")
    p.add_argument("overrides", nargs="*", metavar="key=value", help="trainer overrides for every run")
    args = p.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    if args.reuse:
        result = reuse(args.reuse, args.seed, args.report_steps)
    else:
        result = run(args.steps, args.report_steps, args.curve_every, args.recipes, args.out, args.overrides,
                     peer_full_logits=args.peer_full_logits)
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=1))
    _print(result)
    return 0


if __name__ == "__main__":
    sys.exit(main())
