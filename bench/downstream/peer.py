"""The downstream peer: transformers' run_mlm recipe pretrained at the same budget as one of our recipes, saved as
a transformers directory that `albert-dist finetune` scores like any of our runs.

Same model config, initial weights, corpus, tokenizer, optimiser, schedule, clipping, global batch and steps as
the recipe's job on ``--ranks`` ranks (``train_micro_batch_size_per_gpu x gradient_accumulation_steps x ranks``
sequences per step); run_mlm's objective (lines grouped into full blocks, 15% of single tokens masked, MLM only).
The training loop is `bench/convergence/convergence.py`'s `train_peer_model` (single process).

    python bench/downstream/peer.py --recipe configs/pretrain/albert-tiny-wikitext2.yaml --ranks 2 --out runs/peer
    albert-dist finetune runs/peer --task sst2 --data-dir ../shared/corpora/glue-sst2
"""
from __future__ import annotations

import argparse
import json
import shutil
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "convergence"))
import convergence as conv  # noqa: E402  (bench/convergence is not a package)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--recipe", required=True, help="our recipe whose budget the peer matches")
    p.add_argument("--ranks", type=int, default=2, help="ranks of our job (the global batch multiplies by it)")
    p.add_argument("--out", required=True, help="transformers directory to write (save_pretrained + tokenizer)")
    p.add_argument("overrides", nargs="*", metavar="key=value", help="overrides applied to the recipe, as ours")
    args = p.parse_args(argv)

    import torch

    from albert_dist.config import load_config
    from albert_dist.data.tokenizer import write_transformers_config

    torch.set_num_threads(1)
    cfg = load_config(args.recipe, list(args.overrides))
    # our global batch in one process: the peer's micro batch is the whole of it
    batch = cfg.engine.train_micro_batch_size_per_gpu * args.ranks
    cfg = load_config(args.recipe, [*args.overrides, f"engine.train_micro_batch_size_per_gpu={batch}"])
    t0 = time.perf_counter()
    model, _ = conv.train_peer_model(cfg, cfg.max_steps, cfg.max_steps, scoring=None)
    train_s = time.perf_counter() - t0
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out)
    shutil.copyfile(cfg.data.tokenizer_path, out / "spiece.model")
    write_transformers_config(out, cfg.model.max_position_embeddings)
    record = {"recipe": args.recipe, "overrides": args.overrides, "steps": cfg.max_steps,
              "global_batch": batch * cfg.engine.gradient_accumulation_steps, "train_s": round(train_s, 1)}
    (out / "peer.json").write_text(json.dumps(record, indent=2) + "\n")
    print(json.dumps(record))
    return 0


if __name__ == "__main__":
    sys.exit(main())
