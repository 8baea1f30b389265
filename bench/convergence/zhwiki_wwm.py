"""What word-level masking buys on Chinese (issue 27): the zhwiki recipe trained twice at equal steps, with
character-level units (``data.chinese_word_segmentation=none``) and with jieba words (``jieba``), each final model
scored on both held-out sets (word-masked and character-masked) with the unigram baseline of each set.

    python bench/convergence/zhwiki_wwm.py [--steps 300] [--runs runs/zhwiki-wwm]   # train both, then score
    python bench/convergence/zhwiki_wwm.py --score-only                              # score existing runs

Needs the prepared corpus (configs/pretrain/albert-tiny-zhwiki.yaml says how). Each run goes through
launch/pretrain_local.sh (2 CPU ranks); a variant whose run directory already holds ``final_model`` is not
trained again. Scores: MLM accuracy over the set's masked positions (``AlbertForPreTraining.logits``, argmax),
computed here in one process from ``final_model/fp32/model.safetensors`` (``albert_dist.runs.weights.load_model``);
the sets are the recipe's fixed validation set (``albert_dist.data.validation.build_validation_set``) built with each segmentation setting.
Writes ``<--runs>/zhwiki-wwm.json`` (``--json bench/convergence/runs/zhwiki-wwm.json``: the committed record)
and prints a markdown table.
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
RECIPE = ROOT / "configs/pretrain/albert-tiny-zhwiki.yaml"
#: variant -> the value of data.chinese_word_segmentation it trains with
VARIANTS = {"characters": "none", "words": "jieba"}
OUT = ROOT / "bench/convergence/runs/zhwiki-wwm.json"  # docs/convergence-chinese.md's record: written when asked


def train_variant(name: str, steps: int, runs: Path) -> Path:
    """Train one variant with the deepspeed launcher (2 ranks) unless its run already finished; its run dir."""
    run_dir = runs / name
    if (run_dir / "final_model").is_dir():
        return run_dir
    overrides = [f"max_steps={steps}", f"eval_interval_steps={steps}", f"checkpoint.save_interval_steps={steps}",
                 f"data.chinese_word_segmentation={VARIANTS[name]}"]
    env = {**os.environ, "RUN_DIR": str(run_dir), "OMP_NUM_THREADS": "1"}
    subprocess.run(["bash", str(ROOT / "launch/pretrain_local.sh"), "2", str(RECIPE), *overrides], env=env,
                   check=True, cwd=ROOT)
    return run_dir


def score(run_dirs: dict[str, Path]) -> dict:
    """MLM accuracy of every run's final model on each held-out set, and each set's unigram baseline."""
    import torch

    from albert_dist.config import load_config
    from albert_dist.data.tokenizer import load_tokenizer
    from albert_dist.data.validation import build_validation_set, token_counts, unigram_baseline
    from albert_dist.runs.weights import load_model

    torch.set_num_threads(1)
    cfg = load_config(RECIPE)
    sp = load_tokenizer(cfg.data.tokenizer_path)
    probs = token_counts(cfg.data, sp)
    sets = {name: build_validation_set(dataclasses.replace(cfg.data, chinese_word_segmentation=seg), sp)
            for name, seg in VARIANTS.items()}
    result: dict = {"steps": None, "sets": {}, "runs": {}}
    for set_name, vset in sets.items():
        labels = torch.cat([b["mlm_labels"] for b in vset.rank_batches(0, 1, 64)])
        base = unigram_baseline(labels, probs)
        result["sets"][set_name] = {"masked_tokens": vset.masked_tokens, "examples": len(vset),
                                    "unigram_mlm_accuracy": base["unigram_mlm_accuracy"]}
    for run_name, run_dir in run_dirs.items():
        model = load_model(run_dir / "final_model/fp32/model.safetensors", cfg.model).eval()  # restores tied keys
        metrics = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
        result["steps"] = max(m.get("step", 0) for m in metrics)
        accs = {}
        for set_name, vset in sets.items():
            hits = total = 0
            with torch.no_grad():
                for batch in vset.rank_batches(0, 1, 64):
                    mlm, _ = model.logits(batch["input_ids"], batch["attention_mask"], batch["token_type_ids"])
                    labels = batch["mlm_labels"]
                    where = labels != -100
                    hits += int((mlm.argmax(-1)[where] == labels[where]).sum())
                    total += int(where.sum())
            accs[set_name] = hits / total
        result["runs"][run_name] = accs
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--runs", type=Path, default=ROOT / "runs/zhwiki-wwm")
    parser.add_argument("--score-only", action="store_true")
    parser.add_argument("--json", type=Path, default=None,
                        help=f"write the result here (default <--runs>/zhwiki-wwm.json; {OUT.relative_to(ROOT)} for the "
                             "committed record)")
    args = parser.parse_args()
    run_dirs = {name: (args.runs / name if args.score_only else train_variant(name, args.steps, args.runs))
                for name in VARIANTS}
    result = score(run_dirs)
    out = args.json or args.runs / "zhwiki-wwm.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=2) + "\n")
    sets = result["sets"]
    print(f"| trained with (step {result['steps']}) | " + " | ".join(
        f"{s}-masked set ({sets[s]['masked_tokens']} tokens)" for s in sets) + " |")
    print("|---|" + "---|" * len(sets))
    for run_name, accs in result["runs"].items():
        print(f"| {run_name} | " + " | ".join(f"{accs[s]:.4f} ({accs[s] / sets[s]['unigram_mlm_accuracy']:.2f}x unigram)"
                                               for s in sets) + " |")
    print("| unigram baseline | " + " | ".join(f"{sets[s]['unigram_mlm_accuracy']:.4f}" for s in sets) + " |")
    sys.stdout.flush()


if __name__ == "__main__":
    main()
