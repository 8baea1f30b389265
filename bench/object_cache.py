"""Where a local cache of object-store data pays (issue 26 item 5): the reads each kind of data costs per job.

    python bench/object_cache.py                  # ~30 s on 2 loaded cores
    python bench/object_cache.py --write-doc      # and the committed figures: the table into
                                                  # docs/data-object-store.md, the result into bench/results

One run against a real S3 HTTP server on localhost (moto's, in its own process: tests/fixtures/s3_server.py),
the README's job's validation file (configs/pretrain/albert-tiny-wikitext.yaml: the bundled WikiText-2 sample)
and a training corpus of ``--mb`` MB of real WikiText paragraphs in 8 .txt files (bench/data_scale.py's
generator) in ``s3://bench/``, with that job's data settings; times are medians of `REPEATS`:

* **validation set** (`albert_dist.data.validation.build_validation_set`, what every rank builds at the start of
  every job and resume): built from local disk, from S3 without the cache, from S3 through the cache on a miss
  (the node's first rank: download, then build) and on a hit (the node's other ranks, later (re)starts);
  bytes the server sent (`albert_dist.data.sources.store.COUNTERS`) and wall seconds;
* **a training epoch** of the training files, read by `SLOTS` slots from S3 with the loader's own plan: bytes the
  server sent / bytes of the objects (each byte read once per epoch: a cached copy would not be read again before
  the next epoch);
* **the tokenizer's sample** (`albert_dist.data.sample.ByteBudgetSample`, one pass per ``tokenizer train``) of a
  budget of 1/8 of the training files: bytes the server sent / text bytes sampled, and / the objects' size.

Localhost has no network: on a real bucket every remote byte and request costs more, a cache hit does not.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import textwrap
import time
from pathlib import Path

BENCH_DIR = Path(__file__).resolve().parent
REPO = BENCH_DIR.parent
sys.path.insert(0, str(BENCH_DIR))
sys.path.insert(0, str(REPO / "tests"))  # the S3 server the tests start (tests/fixtures/s3_server.py)

RECIPE = REPO / "configs" / "pretrain" / "albert-tiny-wikitext.yaml"
SAMPLE = REPO / "data" / "sample"
RANKS_PER_NODE = 8
SLOTS = 4
REPEATS = 5


def _measure(fn) -> tuple[object, float, int, int]:
    """(result, seconds, bytes the server sent, requests) of ``fn()``."""
    from albert_dist.data.sources import store

    before = dict(store.COUNTERS)
    t0 = time.perf_counter()
    out = fn()
    seconds = time.perf_counter() - t0
    return (out, seconds, store.COUNTERS["bytes_requested"] - before.get("bytes_requested", 0),
            store.COUNTERS["requests"] - before.get("requests", 0))


def run(repeats: int = REPEATS, mb: int = 16) -> dict:
    """The figures of the module docstring, as a JSON-able dict (times: medians of ``repeats`` builds)."""
    import dataclasses
    import statistics

    import torch

    from albert_dist.config import load_config
    from albert_dist.data.sources import store
    from albert_dist.data.config import SourceConfig
    from albert_dist.data.sources.read import read_piece
    from albert_dist.data.sources.discover import slot_shares
    from albert_dist.data.sample import ByteBudgetSample
    from albert_dist.data.stream import pieces_of
    from albert_dist.data.tokenizer import load_tokenizer
    from albert_dist.data.validation import build_validation_set
    from data_scale import make_corpus
    from fixtures.s3_server import S3Server

    valid = SAMPLE / "wikitext-2-validation.txt"
    work = tempfile.TemporaryDirectory()
    train = make_corpus(Path(work.name), mb << 20, files=8, kind="txt")
    server = S3Server(process=True)
    try:
        os.environ.update(server.env())
        server.bucket("bench")
        server.upload(valid, "s3://bench/valid.txt")
        for f in train:
            server.upload(f, f"s3://bench/train/{f.name}")
        data = load_config(RECIPE).data
        sp = load_tokenizer(str(REPO / data.tokenizer_path))
        out: dict = {"validation_file": valid.name, "validation_bytes": valid.stat().st_size,
                     "train_files": len(train), "train_bytes": sum(f.stat().st_size for f in train)}
        with tempfile.TemporaryDirectory() as cache_dir:
            def build(path: str, cache_max_bytes: int):
                cfg = dataclasses.replace(data, validation=[SourceConfig(paths=[path])], cache_dir=cache_dir,
                                          cache_max_bytes=cache_max_bytes)
                store._STAT.clear()  # a new process: it lists the store again
                return build_validation_set(cfg, sp)

            build(str(valid), 0)  # warm: imports, the S3 client
            build("s3://bench/valid.txt", 0)
            rows = {}
            reference = None
            for name, path, bound in (("local disk", str(valid), 0), ("s3, no cache", "s3://bench/valid.txt", 0),
                                      ("s3, cache miss", "s3://bench/valid.txt", 1 << 30),
                                      ("s3, cache hit", "s3://bench/valid.txt", 1 << 30)):
                times = []
                for _ in range(repeats):
                    if name == "s3, cache miss":  # an empty cache each time
                        for entry in Path(cache_dir).iterdir():
                            entry.unlink()
                    vset, seconds, nbytes, requests = _measure(lambda: build(path, bound))
                    times.append(seconds)
                    reference = reference or vset
                    assert all(torch.equal(vset.batch[k], reference.batch[k]) for k in reference.batch), name
                rows[name] = {"seconds": round(statistics.median(times), 3), "bytes_requested": nbytes,
                              "requests": requests}
            out["validation_set"] = {"examples": len(reference), "documents": reference.documents, "repeats": repeats,
                                     "builds": rows}
            no_cache, miss = rows["s3, no cache"]["bytes_requested"], rows["s3, cache miss"]["bytes_requested"]
            out["validation_bytes_per_node_start"] = {"ranks_per_node": RANKS_PER_NODE,
                                                      "no_cache": RANKS_PER_NODE * no_cache, "cache": miss}

        store._STAT.clear()
        src = SourceConfig(paths=["s3://bench/train/"])
        pieces = pieces_of(src, "bench", data.shard_piece_bytes, SLOTS)

        def epoch() -> int:
            docs = 0
            for slot in range(SLOTS):
                for i, k, j in slot_shares(len(pieces), SLOTS, slot):
                    docs += sum(1 for _ in read_piece(pieces[i], "text", "blank_line", 1 << 20, (k, j)))
            return docs

        docs, seconds, nbytes, requests = _measure(epoch)
        out["train_epoch"] = {"slots": SLOTS, "documents": docs, "seconds": round(seconds, 3), "bytes_requested": nbytes,
                              "requests": requests, "over_object_bytes": round(nbytes / out["train_bytes"], 3)}

        store._STAT.clear()
        budget = out["train_bytes"] // 8
        sample = ByteBudgetSample([src], "bench", budget)
        texts, seconds, nbytes, requests = _measure(lambda: sum(len(t.encode()) for t in sample))
        out["tokenizer_sample"] = {"budget_bytes": budget, "text_bytes": texts, "seconds": round(seconds, 3),
                                   "bytes_requested": nbytes, "requests": requests,
                                   "over_sample_bytes": round(nbytes / texts, 3),
                                   "objects_over_requested": round(out["train_bytes"] / nbytes, 2)}
        return out
    finally:
        server.stop()
        work.cleanup()


def table(r: dict) -> str:
    v = r["validation_set"]
    lines = [textwrap.fill(f"Validation set ({v['examples']} examples from {v['documents']} documents of "
                           f"{r['validation_file']}, {r['validation_bytes']:,} bytes), one build (median of "
                           f"{v['repeats']}):", 115), "",
             "| build | seconds | bytes from S3 | requests |", "| --- | --- | --- | --- |"]
    for name, row in v["builds"].items():
        lines.append(f"| {name} | {row['seconds']:.2f} | {row['bytes_requested']:,} | {row['requests']} |")
    n = r["validation_bytes_per_node_start"]
    t, s = r["train_epoch"], r["tokenizer_sample"]
    prose = [f"Per node and job start ({n['ranks_per_node']} ranks each build the set): {n['no_cache']:,} bytes "
              f"from S3 without the cache, {n['cache']:,} with it (the first build of the node), 0 on every later "
              "start while the entry stays cached.",
              f"A training epoch ({r['train_files']} files, {r['train_bytes']:,} bytes, {t['slots']} slots): "
              f"{t['bytes_requested']:,} bytes from S3 = {t['over_object_bytes']:.2f}x the objects: each byte is read "
              "once per epoch, so a cached copy would be written and not read again before the next epoch (and a "
              "corpus larger than the bound would be evicted before that).",
              f"The tokenizer's sample (budget {s['budget_bytes']:,} bytes, one pass per `tokenizer train`): "
              f"{s['bytes_requested']:,} bytes from S3 = {s['over_sample_bytes']:.2f}x the {s['text_bytes']:,} "
              f"bytes of text sampled ({1 / s['objects_over_requested']:.2f}x the objects) in {s['requests']} "
              "requests, in one pass per run: a cache would pay only when the same command runs again."]
    return "\n".join(lines) + "\n\n" + "\n\n".join(textwrap.fill(p, 115) for p in prose)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mb", type=int, default=16, help="MB of training text (default 16)")
    parser.add_argument("--write-doc", action="store_true", help="write the table into docs/data-object-store.md "
                        "and the result into bench/results/object_cache.json (the committed figures)")
    parser.add_argument("--json", default=None, help="also write the result to this file")
    args = parser.parse_args()
    result = run(mb=args.mb)
    print(json.dumps(result, indent=2))
    print(table(result))
    # into the repository only when asked (--write-doc: the doc's figures and their record go together)
    for path in [*([args.json] if args.json else []), *([BENCH_DIR / "results" / "object_cache.json"]
                                                          if args.write_doc else [])]:
        Path(path).write_text(json.dumps(result, indent=2) + "\n")
    if args.write_doc:
        from _common import write_block

        write_block(REPO / "docs" / "data-object-store.md", "object-cache", table(result))


if __name__ == "__main__":
    main()
