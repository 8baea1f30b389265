"""A corpus in S3 against the same corpus on local disk (issue 26): bytes requested / bytes used, and throughput.

    python bench/object_store.py                 # 40 MB of .jsonl.zst text (the suite's size; ~5 min on 2 loaded cores)
    python bench/object_store.py --mb 160        # a larger corpus
    python bench/object_store.py --latency-ms 0  # moto's own speed (localhost has no network latency)

One run, one corpus: a .jsonl.zst corpus (bench/data_scale.py's generator: real WikiText paragraphs) is
uploaded to a real S3 HTTP server on localhost (moto's, in its own process: tests/fixtures/s3_server.py), then
``albert-dist data prepare`` reads it from ``s3://raw/`` and writes ``s3://prepared/`` (sized for 64 x 8 = 512
slots), and the same prepare runs locally. The reads then go through a proxy that holds every ranged GET back
``--latency-ms`` (default 30: S3's first-byte latency is 10-50 ms), once without read-ahead
(``READ_AHEAD_PIECES = 0``) and once with it (`albert_dist.data.sources.store.ReadAhead`), each measuring:

* ``loader_s3_over_local``: batches per second of a training loader (rank 0 of 64, 0 workers: one slot; 16 x 128
  tokens a batch, ``LOADER_BATCHES`` batches after the first) over the bucket / over local disk: what training
  sees, reading interleaved with tokenizing and masking;
* for 64 and 512 slots, every slot's share of the prepared pieces (the loader's own plan: ``pieces_of`` +
  ``slot_shares``) read bare (no tokenizing) once from the bucket and once from local disk, in this process, one
  slot after the other: ``bytes_requested / bytes_used`` (bytes the S3 server sent while the slots read, over
  the bytes of the pieces they own; footers are parsed by planning, once per rank, shown apart:
  ``footer_bytes_per_rank``) and ``s3_over_local_throughput`` (documents per second, both from a cold start of
  the read; the page cache holds the local files, so this is the cost of HTTP requests against a page-cache read);
* ``prepare``: the s3 -> s3 and local -> local prepare wall seconds and their ratio, and whether the shards are
  byte-identical (sha256 in both manifests).
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path

BENCH_DIR = Path(__file__).resolve().parent
sys.path.insert(0, str(BENCH_DIR))
sys.path.insert(0, str(BENCH_DIR.parent / "tests"))  # the S3 server the tests start (tests/fixtures/s3_server.py)

SLOT_COUNTS = (64, 512)
TARGET_RANKS, TARGET_WORKERS = 64, 8
LOADER_BATCH, LOADER_BATCHES = 16, 100  # the main recipe's micro batch of 128-token sequences


def _read_slots(source, slots: int) -> dict:
    """Every slot's share read once, each with its own `ReadAhead` (as a training slot reads it); bytes used
    (the pieces' nbytes), documents, seconds, requests."""
    from functools import partial

    from albert_dist.data.sources import store
    from albert_dist.data.sources.read import piece_read_ranges, read_piece
    from albert_dist.data.sources.discover import slot_shares
    from albert_dist.data.stream import pieces_of

    t_plan = time.perf_counter()
    before = dict(store.COUNTERS)
    pieces = pieces_of(source, "bench", 4 << 20, slots)
    footer = store.COUNTERS["bytes_requested"] - before.get("bytes_requested", 0)
    plan_s = time.perf_counter() - t_plan
    start = dict(store.COUNTERS)
    used = docs = 0
    t0 = time.perf_counter()
    ranges_of = partial(piece_read_ranges, text_field="text", txt_documents="blank_line")
    for slot in range(slots):
        shares = slot_shares(len(pieces), slots, slot)
        ahead = store.ReadAhead([pieces[i] for i, _, _ in shares], ranges_of)
        for at, (i, k, j) in enumerate(shares):
            ahead.at(at)
            used += pieces[i]["nbytes"]
            docs += sum(1 for r in read_piece(pieces[i], "text", "blank_line", 4 << 20, (k, j)) if not r["skip"])
    seconds = time.perf_counter() - t0
    return {"pieces": len(pieces), "bytes_used": used, "documents": docs, "read_s": round(seconds, 3),
            "plan_s": round(plan_s, 3), "footer_bytes_per_rank": footer,
            "bytes_requested": store.COUNTERS["bytes_requested"] - start.get("bytes_requested", 0),
            "requests": store.COUNTERS["requests"] - start.get("requests", 0)}


def _loader_rate(path: str, batches: int) -> float:
    """Batches per second of rank 0's training loader (0 workers) in a job of `TARGET_RANKS` ranks reading the
    prepared corpus at ``path``, over ``batches`` batches after its first (planning and start-up excluded): what
    a training worker does with each document (tokenize, pack, mask) against what reading it costs."""
    from albert_dist.data.config import DataConfig, SourceConfig
    from albert_dist.data.loader import build_train_loader

    cfg = DataConfig(train=[SourceConfig(paths=[path])], num_workers=0, max_seq_length=128)
    it = iter(build_train_loader(cfg, LOADER_BATCH, rank=0, world_size=TARGET_RANKS))
    next(it)
    t0 = time.perf_counter()
    for _ in range(batches):
        next(it)
    return batches / (time.perf_counter() - t0)


def _reset_caches() -> None:
    from fixtures.s3_server import _clear_fsspec

    _clear_fsspec()


def run(repeats: int = 1, mb: int = 40, latency_ms: float = 30.0) -> dict:
    """The figures of the module docstring; ``repeats`` reads of each slot count (ratios per repeat);
    ``latency_ms`` added to every ranged GET of the reads (not of the prepare)."""
    import data_scale
    from fixtures.s3_server import FaultProxy, S3Server

    from albert_dist.data.sources import store

    from albert_dist.data.prepare.options import PrepareOptions
    from albert_dist.data.prepare.run import prepare
    from albert_dist.data.config import SourceConfig

    work = Path(tempfile.mkdtemp(prefix="bench-object-store-"))
    server = S3Server(process=True)  # its own process: the reader does not share our interpreter lock with it
    os.environ.update(server.env())
    os.environ["ALBERT_DIST_PREPARE_TMP"] = str(work / "prepare-tmp")
    try:
        raw = work / "raw"
        data_scale.make_corpus(raw, mb << 20, files=8, kind="jsonl", compression=".zst")
        server.bucket("raw")
        server.bucket("prepared")
        server.upload(raw, "s3://raw/corpus")
        _reset_caches()

        def opts(src: str, out: str) -> PrepareOptions:
            return PrepareOptions(sources=[SourceConfig(paths=[src])], output=out, tokenizer_path=None,
                                  target_ranks=TARGET_RANKS, target_loader_workers=TARGET_WORKERS,
                                  progress=False)

        t0 = time.perf_counter()
        local_manifest = prepare(opts(str(raw), str(work / "prepared")), "bench local")
        local_prepare_s = time.perf_counter() - t0
        t0 = time.perf_counter()
        s3_manifest = prepare(opts("s3://raw/corpus", "s3://prepared/corpus"), "bench s3")
        s3_prepare_s = time.perf_counter() - t0
        identical = ([e["sha256"] for e in local_manifest["files"]] == [e["sha256"] for e in s3_manifest["files"]])
        result: dict = {"corpus_mb": mb, "text_bytes": s3_manifest["bytes"], "row_groups": s3_manifest["row_groups"],
                        "shards": s3_manifest["num_shards"],
                        "prepare": {"local_s": round(local_prepare_s, 2), "s3_s": round(s3_prepare_s, 2),
                                    "s3_over_local_s": round(s3_prepare_s / local_prepare_s, 3),
                                    "identical_shards": identical}}
        proxy = FaultProxy(server.endpoint, every=0, delay_s=latency_ms / 1000).start()
        os.environ["AWS_ENDPOINT_URL"] = proxy.endpoint  # the reads see a bucket's first-byte latency
        result["latency_ms"] = latency_ms
        depth = store.READ_AHEAD_PIECES
        for label, store.READ_AHEAD_PIECES in (("no_read_ahead", 0), ("read_ahead", depth)):
            for slots in SLOT_COUNTS:
                ratios, amplification, rows = [], [], []
                for _ in range(repeats):
                    _reset_caches()
                    s3 = _read_slots(SourceConfig(paths=["s3://prepared/corpus"]), slots)
                    local = _read_slots(SourceConfig(paths=[str(work / "prepared")]), slots)
                    assert s3["documents"] == local["documents"], (s3, local)
                    amplification.append(round(s3["bytes_requested"] / s3["bytes_used"], 4))
                    ratios.append(round((s3["documents"] / s3["read_s"]) / (local["documents"] / local["read_s"]),
                                        3))
                    rows.append({"s3": s3, "local": {k: local[k] for k in ("read_s", "plan_s", "documents")}})
                result[f"{label}_slots_{slots}"] = {"bytes_requested_over_used": amplification,
                                                    "s3_over_local_throughput": ratios, "detail": rows}
            loader = []
            for _ in range(repeats):
                _reset_caches()
                s3_rate = _loader_rate("s3://prepared/corpus", LOADER_BATCHES)
                loader.append(round(s3_rate / _loader_rate(str(work / "prepared"), LOADER_BATCHES), 3))
            result[f"{label}_loader_s3_over_local"] = loader
        store.READ_AHEAD_PIECES = depth
        proxy.stop()
        return result
    finally:
        server.stop()
        import shutil

        shutil.rmtree(work, ignore_errors=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--mb", type=int, default=40, help="MB of text in the generated corpus")
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--latency-ms", type=float, default=30.0,
                        help="added to every ranged GET of the reads (S3's first-byte latency: 10-50 ms)")
    args = parser.parse_args()
    result = run(args.repeats, args.mb, args.latency_ms)
    print(json.dumps(result, indent=2))
    print(f"\nprepare s3->s3 / local: {result['prepare']['s3_over_local_s']}x the wall time "
          f"(identical shards: {result['prepare']['identical_shards']})")
    for label in ("no_read_ahead", "read_ahead"):
        print(f"{label} ({args.latency_ms:g} ms a request): training loader S3 / local batches/s "
              f"{result[f'{label}_loader_s3_over_local']}")
        for slots in SLOT_COUNTS:
            r = result[f"{label}_slots_{slots}"]
            print(f"  {slots:4d} slots read bare: bytes requested / bytes used {r['bytes_requested_over_used']}, "
                  f"S3 / local-disk throughput {r['s3_over_local_throughput']}, footers per rank "
                  f"{r['detail'][0]['s3']['footer_bytes_per_rank'] / 2**10:.0f} KiB")


if __name__ == "__main__":
    main()
