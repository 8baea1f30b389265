"""What a content checksum of every checkpoint file would cost, relative to the save itself (issue 13: add one
only if it costs < 5 % of the save time).

For each model preset, one process, ZeRO-2, fp32, CPU: ``albert_dist.engine.checkpoint.save_checkpoint`` (the
trainer's path, including the size-only verification it does), then the time to checksum the files it wrote
with zlib.crc32, xxhash.xxh64 (when installed) and hashlib.blake2b, reading them back in 4 MiB blocks. The files
were just written, so they are in the page cache: the best case for a checksum (a separate pass after the save;
hashing inside torch.save's writer is not possible without replacing DeepSpeed's checkpoint engine).

    python bench/checkpoint_checksum.py [--repeats 3] [--presets albert-tiny albert-base]
"""
from __future__ import annotations

import argparse
import hashlib
import logging
import statistics
import tempfile
import time
import zlib
from pathlib import Path
from typing import Any, Callable

import torch
from _common import synthetic_batch

ROOT = Path(__file__).resolve().parents[1]
MODEL_DIR = ROOT / "configs" / "model"
BLOCK = 4 << 20


def _checksummers() -> dict[str, Callable[[Path], Any]]:
    def crc32(path: Path) -> int:
        value = 0
        with open(path, "rb") as fh:
            while block := fh.read(BLOCK):
                value = zlib.crc32(block, value)
        return value

    def streamed(h, path: Path) -> str:  # hashlib-style objects: update() per block, hexdigest() at the end
        with open(path, "rb") as fh:
            while block := fh.read(BLOCK):
                h.update(block)
        return h.hexdigest()

    def blake2b(path: Path) -> str:
        return streamed(hashlib.blake2b(), path)

    out = {"crc32": crc32, "blake2b": blake2b}
    try:
        import xxhash

        def xxh64(path: Path) -> str:
            return streamed(xxhash.xxh64(), path)

        out["xxh64"] = xxh64
    except ImportError:
        pass
    return out


def bench_preset(preset: str, repeats: int, workdir: Path) -> dict[str, Any]:
    """Save `repeats` checkpoints of `preset`; per repeat the save time and each checksum's time and share."""
    import deepspeed

    from albert_dist.config import TrainConfig, config_hash, load_model_config, to_container
    from albert_dist.engine.checkpoint.layout import payload_files
    from albert_dist.engine.checkpoint.load import UNIVERSAL_CHECKPOINT_INFO
    from albert_dist.engine.checkpoint.save import save_checkpoint
    from albert_dist.engine.deepspeed_config import build_deepspeed_config
    from albert_dist.engine.optim import build_optimizer
    from albert_dist.model import AlbertForPreTraining

    torch.manual_seed(0)
    cfg = TrainConfig(model=load_model_config(preset))
    cfg.engine.train_micro_batch_size_per_gpu, cfg.engine.zero_stage = 2, 2
    model = AlbertForPreTraining(cfg.model)
    model.universal_checkpoint_info = UNIVERSAL_CHECKPOINT_INFO
    engine, *_ = deepspeed.initialize(model=model, optimizer=build_optimizer(model, cfg.optimizer).optimizer,
                                      config=build_deepspeed_config(cfg.engine, world_size=1))
    engine.backward(engine(**synthetic_batch(cfg.model.vocab_size, batch=2, seq=64, predictions=8)).loss)
    engine.step()
    sums = _checksummers()
    out: dict[str, Any] = {"save_s": [], "bytes": 0, **{f"{k}_s": [] for k in sums}, **{f"{k}_share": [] for k in sums}}
    for i in range(repeats):
        t0 = time.perf_counter()
        tag = save_checkpoint(engine, workdir, i + 1, {"pos": i}, config_hash(cfg), keep_last=repeats + 1,
                                   config=to_container(cfg))
        save_s = time.perf_counter() - t0
        files = [workdir / tag / rel for rel in payload_files(workdir / tag)]
        out["save_s"].append(save_s)
        out["bytes"] = sum(f.stat().st_size for f in files)
        for name, fn in sums.items():
            t0 = time.perf_counter()
            for f in files:
                fn(f)
            spent = time.perf_counter() - t0
            out[f"{name}_s"].append(spent)
            out[f"{name}_share"].append(spent / save_s)
    engine.destroy()
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--presets", nargs="+", default=["albert-tiny", "albert-base"])
    args = parser.parse_args()
    logging.basicConfig(level=logging.WARNING)
    torch.set_num_threads(1)
    from albert_dist.distributed.group import init_distributed

    init_distributed()
    for preset in args.presets:
        with tempfile.TemporaryDirectory() as tmp:
            r = bench_preset(preset, args.repeats, Path(tmp))
        line = [f"{preset}: {r['bytes'] / 2**20:.1f} MiB, save {statistics.median(r['save_s']):.3f} s"]
        for key in r:
            if key.endswith("_share"):
                name = key[: -len("_share")]
                line.append(f"{name} {statistics.median(r[name + '_s']):.3f} s = "
                            f"{100 * statistics.median(r[key]):.1f} % of the save")
        print("; ".join(line))


if __name__ == "__main__":
    main()
