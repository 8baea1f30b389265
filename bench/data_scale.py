"""Data at the sizes users run (issue 19): read amplification per cluster size, per-slot throughput against corpus
size, start-up with many files, the plan of a 1,024 x 8-slot job.

    python bench/data_scale.py                       # the suite's sizes (bench/run_all.py; ~2 min on 2 cores)
    python bench/data_scale.py --full                # the issue's sizes: 1 GB vs 64 MB, 256 MB corpora
    python bench/data_scale.py --full --10g          # + the tokenizer and prepare on 10 GB corpora
    python bench/data_scale.py --only amplification  # one section: amplification | throughput | startup | plan
                                                     #   | tokenizer | prepare

Corpora are generated under ``--workdir`` (default: a temporary directory, deleted afterwards) from the real text
of ``$BENCH_CORPORA`` (default ``../shared/corpora`` beside the checkout; the bundled sample where that is absent):
WikiText-2 paragraphs and Shakespeare speaker turns, 2-6 per document, three words replaced at random and a
document number appended (distinct documents, text that compresses like text).

Sections (each returns a dict; `run` merges them for bench/run_all.py; load average printed with the figures):

* ``amplification``: read amplification at 1, 8, 64 and 512 slots (ranks x loader workers): the bytes every
  slot's stream reads from storage in one epoch (this process's ``/proc/self/io`` rchar around the slot's epoch,
  the job's own piece plan and slot shares), summed over slots, over the corpus's bytes on disk; next to it the
  figure `albert-dist data plan` predicts from metadata. Corpora: many small .jsonl files, a few large .jsonl
  files, .jsonl.zst files (one piece each: they cannot be split), parquet as pyarrow writes it by default (one
  row group per file), and, once ``albert_dist.data.prepare`` exists, the .jsonl.zst and parquet corpora after
  ``albert-dist data prepare`` (target <= 1.1 at every slot count). Suite: 40 MB corpora (at 512 slots, the
  smallest that holds a 64 KiB piece per slot), ``--full``: 256 MB; every slot read up to 64 slots and 64
  evenly spaced slots of 512 (sum scaled by 512 / 64; the slot plan is symmetric).
* ``throughput``: tokens (non-padding) per CPU-second of one slot (rank 0 of 8, no workers: ``time.process_time``
  from building the loader to the last batch, so planning and start-up count) on a large corpus against a
  small one of the same files' size (the large one has more files; the same document stream, so the text is
  alike), 4 alternating repeats: target >= 0.9
  (median), i.e. no per-slot cost that grows with the corpus. Issue sizes: 1 GB vs 64 MB (``--full``); suite:
  128 MB vs 16 MB.
* ``startup``: wall and CPU seconds (process tree) of a whole 1-step ``albert-dist train`` over 2,000 small
  .jsonl files, against the same run over the bundled sample (8 files), both ~1.1 MB of text; the time to the
  first step is under that. Target: <= 30 s (issue 19 measured 10.9 s on idle cores before the piece plan
  changed); on a loaded machine compare the CPU seconds.
* ``plan``: ``albert-dist data plan --ranks 1024 --workers 8`` over 10,000 .jsonl files (sparse files of 100 MB
  each: 1 TB as the planner sees it, a few MB on disk) and over 10,000 .jsonl.zst files: wall and CPU seconds
  of the command, pieces, amplification. "Seconds", says the issue.

* ``tokenizer``: ``albert-dist tokenizer train --vocab-size 8000`` with the defaults (a byte-budgeted sample from
  every file) in a fresh process per corpus size (40 .txt files): peak RSS (its VmHWM), CPU and wall seconds.
  Peer, same run: the previous behaviour, every document streamed into sentencepiece's own reservoir of 2M
  sentences (``--sample-bytes 1T --input-sentence-size 2000000``). Suite: 100 MB; ``--full``: 100 MB and 1 GB,
  and peak RSS at ``--sample-bytes`` 16M / 32M / 64M on the 100 MB corpus (RSS per byte of sample);
  ``--full --10g``: also 10 GB, the 1 GB corpus's files hard-linked ten times (400 files, 1 GB on disk: the
  sampler reads every path, and its memory does not depend on what is in them; no peer, it would read 10 GB).
  Target (issue 19): peak RSS <= 2 GB at 1 GB and 10 GB.
* ``prepare``: ``albert-dist data prepare`` of a .jsonl.zst corpus (16 files) at ``--workers`` 1 and 2: input MB
  (decompressed) per wall second and per CPU-second (all processes), peak RSS of the main process and of the
  largest worker, and whether the shards are byte-identical. Peer, same run and corpus: HF datasets'
  ``load_dataset("json").to_parquet()`` (what a user would write by hand; it neither deduplicates nor sizes row
  groups), and the peer doing prepare's job: the same with exact deduplication as HF's own scripts write it (a
  batched ``map`` adding each text's hash, xxh3-128 as ours, a ``filter`` keeping first occurrences, then
  ``to_parquet``; issue 26 names the peer "map + to_parquet"). Suite: 64 MB; ``--full``: 1 GB; ``--full --10g``:
  also 10 GB (64 files, ``--workers 1``, both peers, no S3). (Read amplification after prepare: the ``amplification`` section.)
  Also the duplicate search's memory over 4M synthetic hashes (10% repeated): bytes per document in memory, and
  the peak against ``--dedup-memory`` when the hashes are bucketed on disk (a budget of a quarter of the need);
  and the zstd ratio of real text in row-group-sized blocks against one stream (what the output costs on disk
  against a .zst corpus; the generated corpora repeat paragraphs across documents, so their ratios are not real).
  With the suite's S3 server: the same prepare reading the corpus from ``s3://`` (moto's server in its own
  process, tests/fixtures/s3_server.py) against the peer reading the local files, MB per CPU-second in one run.

``run`` calls every section in `SECTIONS`.
"""
from __future__ import annotations

import argparse
import importlib.util
import json
import os
import random
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Callable, Optional

ROOT = Path(__file__).resolve().parents[1]
#: the real text the corpora are generated from: WikiText-2's test.txt and valid.txt, tinyshakespeare/input.txt
#: ($BENCH_CORPORA, default the corpora folder beside the checkout; the bundled sample where absent)
CORPORA = Path(os.environ.get("BENCH_CORPORA", ROOT.parent / "shared" / "corpora"))
SLOT_COUNTS = (1, 8, 64, 512)
AMPLIFICATION_TARGET = 1.1
THROUGHPUT_TARGET = 0.9
STARTUP_TARGET_S = 30.0
RECIPE = "configs/pretrain/albert-tiny-wikitext.yaml"
VOCAB = 8000
TOKENIZER_TARGET_BYTES = 2 * 10**9


# ------------------------------------------------------------------------------------------------ corpora
def _paragraphs() -> list[str]:
    """Real paragraphs: WikiText-2 (number splitting undone, <unk> dropped) and Shakespeare speaker turns."""
    paras: list[str] = []
    wiki = [CORPORA / "wikitext-2" / n for n in ("test.txt", "valid.txt")]
    if not all(p.exists() for p in wiki):  # a checkout without the shared corpora: the bundled sample
        wiki = sorted((ROOT / "data" / "sample").glob("wikitext-2-*.txt"))
    for path in wiki:
        for line in path.read_text(encoding="utf-8").splitlines():
            line = line.strip()
            if len(line) > 40 and not line.startswith("="):
                paras.append(re.sub(r" @(.)@ ", r"\1", line).replace("<unk> ", ""))
    shakespeare = CORPORA / "tinyshakespeare" / "input.txt"
    if shakespeare.exists():
        paras += [t.replace("\n", " ") for t in shakespeare.read_text().split("\n\n") if len(t) > 40]
    return paras


def _documents(seed: int):
    """Distinct documents, forever: 2-6 real paragraphs, three words of the first replaced at random, a number."""
    rng = random.Random(seed)
    paras = _paragraphs()
    words = sorted({w for p in paras[:3000] for w in p.split()})
    doc_id = 0
    while True:
        ps = rng.choices(paras, k=rng.randint(2, 6))
        w = ps[0].split()
        for _ in range(3):
            w[rng.randrange(len(w))] = rng.choice(words)
        ps[0] = " ".join(w) + f" ({doc_id})"
        doc_id += 1
        yield "\n".join(ps)


def make_corpus(out: Path, total_bytes: int, files: int, kind: str = "jsonl", compression: str = "",
                seed: int = 0, row_group_rows: Optional[int] = None) -> list[Path]:
    """``files`` files holding about ``total_bytes`` of text in all (at least one document each), in ``out``:
    ``kind`` "txt" (blank-line documents), "jsonl" ({"text": ...}) or "parquet" (a "text" column, zstd,
    ``row_group_rows`` rows per row group, default pyarrow's: one row group per file here); ``compression``
    "" or ".zst" / ".gz" (txt, jsonl). Returns the paths."""
    import gzip

    import pyarrow as pa
    import pyarrow.parquet as pq
    import zstandard

    out.mkdir(parents=True, exist_ok=True)
    documents = _documents(seed)
    per_file = max(1, total_bytes // files)
    paths = []
    for i in range(files):
        path = out / f"part-{i:05d}.{kind}{compression}"
        docs, size = [], 0
        while size < per_file:
            docs.append(next(documents))
            size += len(docs[-1]) + 2
        if kind == "parquet":
            pq.write_table(pa.table({"text": docs}), path, compression="zstd",
                           row_group_size=row_group_rows or len(docs))
        else:
            data = ("".join(json.dumps({"text": d}) + "\n" for d in docs) if kind == "jsonl"
                    else "\n\n".join(docs) + "\n").encode()
            if compression == ".zst":
                data = zstandard.ZstdCompressor(level=3).compress(data)
            elif compression == ".gz":
                data = gzip.compress(data, compresslevel=6)
            path.write_bytes(data)
        paths.append(path)
    return paths


def _disk_bytes(paths: list[Path]) -> int:
    return sum(p.stat().st_size for p in paths)


# ------------------------------------------------------------------------------------------------ amplification
def _rchar() -> int:
    with open("/proc/self/io") as f:
        return int(next(line for line in f if line.startswith("rchar:")).split()[1])


class _EpochDone(Exception):
    pass


def _slot_epoch_bytes(source, pieces: list[dict], slot: int, slots: int) -> int:
    """Bytes this process reads while slot ``slot`` of ``slots`` streams one epoch of ``source``."""
    from albert_dist.data.stream import SourceStream

    class OneEpoch(SourceStream):
        def _end_epoch(self) -> None:  # stop at the end of epoch 0 instead of starting the next one
            raise _EpochDone

    stream = OneEpoch(source, "bench", pieces, slot, slots, seed=0, shuffle=True, max_document_bytes=4 << 20)
    before = _rchar()
    try:
        while True:
            stream.next_document()
    except _EpochDone:
        pass
    return _rchar() - before


def measure_amplification(pattern: str, disk_bytes: int, slot_counts=SLOT_COUNTS,
                          sample: Optional[int] = 64) -> dict[str, Any]:
    """Measured and planned read amplification of the corpus ``pattern`` per slot count (see the module
    docstring); ``sample``: above this many slots, read this many evenly spaced slots and scale (None: all)."""
    from albert_dist.data.config import DataConfig, SourceConfig
    from albert_dist.data.sources.discover import read_amplification
    from albert_dist.data.stream import pieces_of

    source = SourceConfig(paths=[pattern])
    cap = DataConfig().shard_piece_bytes
    warm = pieces_of(source, "bench", cap, 1)
    _slot_epoch_bytes(source, warm[:1], 0, 1)  # warm-up: imports and first-use reads are not the corpus's
    out: dict[str, Any] = {}
    for slots in slot_counts:
        pieces = pieces_of(source, "bench", cap, slots)  # the job's own plan for this many slots
        measured = list(range(slots)) if sample is None or slots <= sample else sorted(
            {(i * slots) // sample for i in range(sample)})
        t0 = time.process_time()
        total = sum(_slot_epoch_bytes(source, pieces, s, slots) for s in measured)
        out[str(slots)] = {"measured": total * slots / len(measured) / disk_bytes,
                           "planned": read_amplification((p["nbytes"] for p in pieces), slots),
                           "pieces": len(pieces), "slots_read": len(measured),
                           "cpu_s": round(time.process_time() - t0, 2)}
    return out


def _prepare(inputs: str, out: Path, ranks: int, workers: int) -> list[Path]:
    """``albert-dist data prepare`` of ``inputs`` sized for ``ranks`` x ``workers`` slots; the shards."""
    proc = subprocess.run([sys.executable, "-m", "albert_dist.cli", "data", "prepare", "--input", inputs,
                           "--output", str(out), "--target-ranks", str(ranks), "--target-loader-workers",
                           str(workers), "--workers", "1", "--tokenizer", "none", "--no-progress"],
                          cwd=ROOT, capture_output=True, text=True)
    if proc.returncode != 0:
        raise RuntimeError(f"prepare failed:\n{proc.stdout[-2000:]}\n{proc.stderr[-2000:]}")
    return sorted(out.glob("*.parquet"))


def amplification_section(work: Path, corpus_mb: int = 40, sample: Optional[int] = 64) -> dict[str, Any]:
    """Read amplification per slot count for the corpora of the module docstring, before and after prepare."""
    total = corpus_mb * 10**6
    corpora = {
        "many_small_jsonl": (make_corpus(work / "small", total, max(8, corpus_mb * 16), "jsonl", seed=1), "*.jsonl"),
        "few_large_jsonl": (make_corpus(work / "large", total, 4, "jsonl", seed=2), "*.jsonl"),
        "jsonl_zst": (make_corpus(work / "zst", total, 16, "jsonl", ".zst", seed=3), "*.jsonl.zst"),
        "parquet": (make_corpus(work / "parquet", total, 8, "parquet", seed=4), "*.parquet"),
    }
    result: dict[str, Any] = {"corpus_mb": corpus_mb}
    for name, (files, glob) in corpora.items():
        result[name] = {"files": len(files), "disk_bytes": _disk_bytes(files),
                        **measure_amplification(str(files[0].parent / glob), _disk_bytes(files), sample=sample)}
    if importlib.util.find_spec("albert_dist.data.prepare") is None:
        result["after_prepare"] = "albert_dist.data.prepare is not in this version: not measured"
    else:
        for name in ("jsonl_zst", "parquet"):
            files, glob = corpora[name]
            shards = _prepare(str(files[0].parent / glob), work / f"{name}-prepared", max(SLOT_COUNTS), 1)
            result[f"{name}_after_prepare"] = {
                "files": len(shards), "disk_bytes": _disk_bytes(shards),
                **measure_amplification(str(shards[0].parent / "*.parquet"), _disk_bytes(shards), sample=sample)}
    def worst(names) -> Optional[float]:
        values = [v["measured"] for k in names if isinstance(result.get(k), dict) for s, v in result[k].items()
                  if s.isdigit()]
        return max(values) if values else None

    # uncompressed jsonl is cut for the job's slots: it should read once at every slot count (40 MB at 512
    # slots is 1.2 pieces of the 64 KiB floor per slot: the smallest corpus this holds for)
    result["max_uncompressed_jsonl"] = worst(("many_small_jsonl", "few_large_jsonl"))
    after = [worst([k]) for k in result if k.endswith("_after_prepare")]
    after = [a for a in after if a is not None]
    result["max_after_prepare"] = max(after) if after else None
    result["within_target_after_prepare"] = bool(after) and max(after) <= AMPLIFICATION_TARGET
    for name in corpora:
        shutil.rmtree(corpora[name][0][0].parent, ignore_errors=True)
    return result


# ------------------------------------------------------------------------------------------------ throughput
_THROUGHPUT_DRIVER = r"""
import json, sys, time
c0 = time.process_time()
from albert_dist.data.config import DataConfig, SourceConfig
from albert_dist.data.loader import build_train_loader
pattern, tokens_wanted = sys.argv[1], int(sys.argv[2])
cfg = DataConfig(train=[SourceConfig(paths=[pattern])], validation=[], max_seq_length=128, num_workers=0)
c1 = time.process_time()
it = iter(build_train_loader(cfg, 32, rank=0, world_size=8))
tokens = 0
while tokens < tokens_wanted:
    tokens += int(next(it)["attention_mask"].sum())
c2 = time.process_time()
print("RESULT " + json.dumps({"tokens": tokens, "cpu_s": c2 - c1, "import_cpu_s": c1 - c0}))
"""


def _slot_tokens_per_cpu_s(pattern: str, tokens: int) -> dict[str, float]:
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    proc = subprocess.run([sys.executable, "-c", _THROUGHPUT_DRIVER, pattern, str(tokens)], cwd=ROOT, env=env,
                          capture_output=True, text=True)
    line = next((x for x in proc.stdout.splitlines() if x.startswith("RESULT ")), None)
    if proc.returncode != 0 or line is None:
        raise RuntimeError(f"throughput driver failed:\n{proc.stderr[-3000:]}")
    res = json.loads(line[len("RESULT "):])
    return {**res, "tokens_per_cpu_s": res["tokens"] / res["cpu_s"]}


def throughput_section(work: Path, small_mb: int = 16, large_mb: int = 128, tokens: int = 600_000,
                       repeats: int = 4) -> dict[str, Any]:
    """Tokens per CPU-second of one slot on a large corpus against a small one (files of 4 MB each)."""
    file_mb = 4
    # the same document stream (seed): the small corpus is the large one's first files, so the text (and the
    # tokens per character) is alike and only the corpus size differs
    small = make_corpus(work / "tp-small", small_mb * 10**6, max(1, small_mb // file_mb), "jsonl", seed=5)
    large = make_corpus(work / "tp-large", large_mb * 10**6, max(1, large_mb // file_mb), "jsonl", seed=5)
    rows: dict[str, list] = {"small": [], "large": [], "ratio": []}
    for _ in range(repeats):  # alternate, so that load changes hit both
        s = _slot_tokens_per_cpu_s(str(small[0].parent / "*.jsonl"), tokens)
        big = _slot_tokens_per_cpu_s(str(large[0].parent / "*.jsonl"), tokens)
        rows["small"].append(s["tokens_per_cpu_s"])
        rows["large"].append(big["tokens_per_cpu_s"])
        rows["ratio"].append(big["tokens_per_cpu_s"] / s["tokens_per_cpu_s"])
    shutil.rmtree(small[0].parent)
    shutil.rmtree(large[0].parent)
    median = statistics.median(rows["ratio"])
    return {"small_mb": small_mb, "large_mb": large_mb, "small_files": len(small), "large_files": len(large),
            "tokens_per_run": tokens, "tokens_per_cpu_s_small": rows["small"],
            "tokens_per_cpu_s_large": rows["large"], "ratio_large_over_small": rows["ratio"],
            "target_ratio": THROUGHPUT_TARGET, "within_target": median >= THROUGHPUT_TARGET}


# ------------------------------------------------------------------------------------------------ startup
def _run_tree(cmd: list[str]) -> dict[str, float]:
    """Wall and CPU seconds (itself and its children) of ``cmd``; raises on a non-zero exit."""
    env = {k: v for k, v in os.environ.items()
           if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT") and not k.startswith("SLURM_")}
    env["OMP_NUM_THREADS"] = "1"
    t0 = time.perf_counter()
    proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    out = proc.stdout.read()
    _, status, usage = os.wait4(proc.pid, 0)
    wall = time.perf_counter() - t0
    if os.waitstatus_to_exitcode(status) != 0:
        raise RuntimeError(f"{cmd[:6]} failed:\n{out[-3000:]}")
    return {"wall_s": wall, "cpu_s": usage.ru_utime + usage.ru_stime}


def startup_section(work: Path, files: int = 2000, corpus_mb: float = 1.2) -> dict[str, Any]:
    """A 1-step `albert-dist train` over ``files`` small .jsonl files against the bundled sample (8 files), both
    ~1.1 MB of text (the unigram baseline reads up to 64 MiB of the training text: equal sizes keep that out)."""
    corpus = make_corpus(work / "startup", int(corpus_mb * 10**6), files, "jsonl", seed=7)
    short = ["max_steps=1", "engine.zero_stage=0", "engine.train_micro_batch_size_per_gpu=2",
             "data.max_seq_length=64", "data.max_predictions_per_seq=4", "data.eval_examples=8",
             "tracking.enabled=false", "progress_bar=false", "log_interval_steps=1"]
    base = [sys.executable, "-m", "albert_dist.cli", "train", "--config", RECIPE, *short]
    ours = _run_tree(base + [f"run_dir={work / 'run-many'}", f"data.train=[{{paths: ['{corpus[0].parent}/*.jsonl']}}]"])
    peer = _run_tree(base + [f"run_dir={work / 'run-sample'}"])
    shutil.rmtree(corpus[0].parent)
    return {"files": files, "corpus_mb": corpus_mb, "many_files": ours, "bundled_sample": peer,
            "extra_wall_s": ours["wall_s"] - peer["wall_s"], "ratio_cpu_many_over_sample": ours["cpu_s"] / peer["cpu_s"],
            "target_wall_s": STARTUP_TARGET_S,
            "within_target": ours["wall_s"] <= STARTUP_TARGET_S}


# ------------------------------------------------------------------------------------------------ plan
def _sparse_jsonl(folder: Path, files: int, size: int) -> None:
    """``files`` .jsonl files of ``size`` bytes: real JSON lines at the start, a hole after (no disk used)."""
    folder.mkdir(parents=True)
    head = "".join(json.dumps({"text": f"document {i} . two sentences ."}) + "\n" for i in range(20)).encode()
    for i in range(files):
        with open(folder / f"part-{i:05d}.jsonl", "wb") as f:
            f.write(head)
            f.truncate(size)


def plan_section(work: Path, files: int = 10_000, ranks: int = 1024, workers: int = 8) -> dict[str, Any]:
    """`albert-dist data plan` at ``ranks`` x ``workers`` over ``files`` files: 100 MB (sparse) .jsonl files,
    and small .jsonl.zst files (one piece each)."""
    result: dict[str, Any] = {"files": files, "ranks": ranks, "workers": workers}
    sparse = work / "plan-jsonl"
    _sparse_jsonl(sparse, files, 100 * 10**6)
    zst = work / "plan-zst"
    zst.mkdir()
    one = make_corpus(work / "plan-one", 20_000, 1, "jsonl", ".zst", seed=8)[0]
    for i in range(files):
        os.link(one, zst / f"part-{i:05d}.jsonl.zst")
    for name, pattern in (("jsonl_1tb", f"{sparse}/*.jsonl"), ("jsonl_zst", f"{zst}/*.jsonl.zst")):
        cmd = [sys.executable, "-m", "albert_dist.cli", "data", "plan", "--config", RECIPE, "--ranks", str(ranks),
               "--workers", str(workers), "--json", f"data.train=[{{paths: ['{pattern}']}}]"]
        t0 = time.perf_counter()
        proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True)
        wall = time.perf_counter() - t0
        if proc.returncode != 0:
            raise RuntimeError(f"data plan failed:\n{proc.stderr[-2000:]}")
        src = json.loads(proc.stdout)["sources"][0]
        result[name] = {"wall_s": wall, "plan_s": src["plan_s"], "pieces": src["pieces"], "bytes": src["bytes"],
                        "amplification": src["amplification"], "pieces_per_slot": src["pieces_per_slot"]}
    for path in (sparse, zst, one.parent):
        shutil.rmtree(path)
    return result


# ------------------------------------------------------------------------------------------------ tokenizer
def _cli() -> list[str]:
    return [sys.executable, "-m", "albert_dist.cli"]


def _measure(cmd: list[str], env: Optional[dict] = None) -> dict[str, Any]:
    """Run ``cmd`` (`albert-dist tokenizer train`) to completion: its peak RSS (bytes: the "peak memory" it prints,
    its VmHWM; wait4's ru_maxrss would include this benchmark's RSS, which Linux carries across fork + exec),
    CPU and wall seconds."""
    t0 = time.perf_counter()
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            env={**os.environ, **(env or {})}, cwd=ROOT)
    out = proc.stdout.read()
    _, status, usage = os.wait4(proc.pid, 0)
    proc.returncode = os.waitstatus_to_exitcode(status)
    wall = time.perf_counter() - t0
    if proc.returncode != 0:
        raise RuntimeError(f"{cmd} exited {proc.returncode}:\n{out[-3000:]}")
    peak = re.search(r"peak memory (\d+) MiB", out)
    return {"peak_rss_bytes": int(peak.group(1)) * 2**20 if peak else usage.ru_maxrss * 1024,
            "cpu_s": usage.ru_utime + usage.ru_stime, "wall_s": wall, "output": out}


# ------------------------------------------------------------------------------------------------ tokenizer
def tokenizer_section(work: Path, sizes_mb: tuple[int, ...] = (100,), peer: bool = True,
                      ten_gb: bool = False, slope: bool = False) -> dict[str, Any]:
    """Peak RSS / CPU / wall of `tokenizer train` (defaults, vocab 8000) per corpus size, ours and the peer;
    ``slope``: also at ``--sample-bytes`` 16M and 32M on the first corpus, for the RSS per byte of sample."""
    result: dict[str, Any] = {}
    for mb in sizes_mb:
        corpus = work / f"tok{mb}m"
        make_corpus(corpus, mb * 10**6, 40, "txt")
        row = {}
        base = _cli() + ["tokenizer", "train", "--input", str(corpus / "*.txt"), "--vocab-size", str(VOCAB)]
        m = _measure(base + ["--output", str(work / "tok-ours")])
        budget = re.search(r"sample budget ([\d.]+ [KMG]iB)", m["output"])
        row["ours"] = {k: m[k] for k in ("peak_rss_bytes", "cpu_s", "wall_s")}
        row["ours"]["budget"] = budget.group(1) if budget else None
        if slope and mb == sizes_mb[0]:
            # peak RSS against the sample budget: the trainer's cost per byte of sample (what sizes the default)
            points = {64: m["peak_rss_bytes"]}
            for mib_ in (16, 32):
                points[mib_] = _measure(base + ["--output", str(work / "tok-slope"), "--sample-bytes",
                                                f"{mib_}M"])["peak_rss_bytes"]
            result["rss_by_sample_mib"] = {str(k): v for k, v in sorted(points.items())}
            result["rss_bytes_per_sample_byte"] = (points[64] - points[16]) / (48 * 2**20)
        if peer:
            p = _measure(base + ["--output", str(work / "tok-peer"), "--sample-bytes", "1T",
                                 "--input-sentence-size", "2000000"])
            row["peer_reservoir_2m_sentences"] = {k: p[k] for k in ("peak_rss_bytes", "cpu_s", "wall_s")}
            row["ratio_rss_ours_over_peer"] = m["peak_rss_bytes"] / p["peak_rss_bytes"]
        result[f"{mb}MB"] = row
        if not (ten_gb and mb == 1000):
            shutil.rmtree(corpus)
            continue
        # 10 GB: the 1 GB corpus's 40 files hard-linked ten times (400 files, 1 GB on disk)
        big = work / "tok10g"
        big.mkdir()
        for k in range(10):
            for f in sorted(corpus.glob("*.txt")):
                os.link(f, big / f"{k}-{f.name}")
        m = _measure(_cli() + ["tokenizer", "train", "--input", str(big / "*.txt"), "--vocab-size", str(VOCAB),
                               "--output", str(work / "tok-ours")])
        result["10GB"] = {"ours": {k: m[k] for k in ("peak_rss_bytes", "cpu_s", "wall_s")}}
        shutil.rmtree(big)
        shutil.rmtree(corpus)
    result["target_peak_rss_bytes"] = TOKENIZER_TARGET_BYTES
    result["peak_rss_within_target"] = all(r["ours"]["peak_rss_bytes"] <= TOKENIZER_TARGET_BYTES
                                           for k, r in result.items() if isinstance(r, dict) and "ours" in r)
    return result


# ------------------------------------------------------------------------------------------------ prepare
# CPU seconds from getrusage (this process and its reaped workers); peak RSS from VmHWM (prepare records it in
# its manifest: ru_maxrss would include this benchmark's own RSS, which Linux carries across fork + exec)
_PREPARE_DRIVER = """
import json, resource, sys
from albert_dist.cli import main
rc = main(["data", "prepare", *sys.argv[1:]])
me, kids = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
print("RUSAGE " + json.dumps({"rc": rc, "cpu_s": me.ru_utime + me.ru_stime + kids.ru_utime + kids.ru_stime,
                              "minor_faults": me.ru_minflt + kids.ru_minflt}))
"""

_PEER_DRIVER = """
import json, resource, sys, glob
import datasets
datasets.disable_progress_bars()
files, out, cache = sys.argv[1], sys.argv[2], sys.argv[3]
ds = datasets.load_dataset("json", data_files=sorted(glob.glob(files)), split="train", cache_dir=cache)
ds.to_parquet(out)
from albert_dist.sizes import peak_rss_bytes
me, kids = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
print("RUSAGE " + json.dumps({"rc": 0, "peak_rss": peak_rss_bytes(), "rows": ds.num_rows,
      "cpu_s": me.ru_utime + me.ru_stime + kids.ru_utime + kids.ru_stime}))
"""


# the peer doing prepare's job: exact deduplication (first occurrence kept) the way HF's scripts write it
# (e.g. transformers' codeparrot preprocessing: a map adding a hash column, a filter against a set of seen hashes)
_PEER_DEDUP_DRIVER = """
import json, resource, sys, glob
import datasets, xxhash
datasets.disable_progress_bars()
files, out, cache = sys.argv[1], sys.argv[2], sys.argv[3]
ds = datasets.load_dataset("json", data_files=sorted(glob.glob(files)), split="train", cache_dir=cache)
ds = ds.map(lambda b: {"hash": [xxhash.xxh3_128_digest(t.encode()) for t in b["text"]]}, batched=True)
seen = set()
def first(batch):
    keep = []
    for h in batch["hash"]:
        keep.append(h not in seen)
        seen.add(h)
    return keep
ds = ds.filter(first, batched=True).remove_columns("hash")
ds.to_parquet(out)
from albert_dist.sizes import peak_rss_bytes
me, kids = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
print("RUSAGE " + json.dumps({"rc": 0, "peak_rss": peak_rss_bytes(), "rows": ds.num_rows,
      "cpu_s": me.ru_utime + me.ru_stime + kids.ru_utime + kids.ru_stime}))
"""


def _driver(code: str, args: list[str], env: Optional[dict] = None) -> dict[str, Any]:
    t0 = time.perf_counter()
    proc = subprocess.run([sys.executable, "-c", code, *args], capture_output=True, text=True, cwd=ROOT,
                          env={**os.environ, "HF_DATASETS_OFFLINE": "1", **(env or {})})
    wall = time.perf_counter() - t0
    line = next((ln for ln in proc.stdout.splitlines() if ln.startswith("RUSAGE ")), None)
    if proc.returncode != 0 or line is None or json.loads(line[len("RUSAGE "):])["rc"] != 0:
        raise RuntimeError(f"driver failed ({proc.returncode}):\n{proc.stdout[-2000:]}\n{proc.stderr[-3000:]}")
    return {**json.loads(line[len("RUSAGE "):]), "wall_s": wall, "stdout": proc.stdout}


def _text_bytes(files: list[Path]) -> int:
    """Decompressed bytes of the corpus (what prepare reads)."""
    import zstandard

    total = 0
    for f in files:
        with open(f, "rb") as fh:
            reader = zstandard.ZstdDecompressor().stream_reader(fh)
            while chunk := reader.read(1 << 22):
                total += len(chunk)
    return total


_DEDUP_DRIVER = """
import json, sys
from pathlib import Path
import numpy as np
from albert_dist.data.prepare.dedup import find_duplicates
from albert_dist.data.prepare.scan import HASH_DTYPE
from albert_dist.sizes import peak_rss_bytes
work, n, budget = Path(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3])
rng = np.random.default_rng(0)
files, counts = [], []
for t in range(8):  # 8 spool hash files; 1 in 10 documents repeats an earlier hash
    rows = np.zeros(n // 8, dtype=HASH_DTYPE)
    rows["hi"], rows["lo"] = rng.integers(0, 2**63, n // 8, dtype=np.uint64), rng.integers(0, 2**63, n // 8, dtype=np.uint64)
    if t:
        rows[::10] = np.fromfile(files[0], dtype=HASH_DTYPE)[: len(rows[::10])]
    files.append(work / f"{t}.hash")
    rows.tofile(files[-1])
    counts.append(len(rows))
del rows
open("/proc/self/clear_refs", "w").write("5")  # reset VmHWM: measure the search alone
base = peak_rss_bytes()
dups = find_duplicates(files, counts, budget, work / "buckets")
print("RESULT " + json.dumps({"extra_rss_bytes": peak_rss_bytes() - base, "duplicates": int(len(dups))}))
"""


def dedup_memory(work: Path, documents: int = 4_000_000) -> dict[str, Any]:
    """Peak RSS of `find_duplicates` over ``documents`` hashes: in memory (bytes per document, bound
    DEDUP_ROW_BYTES) and bucketed on disk under a budget of a quarter of that (peak / budget)."""
    from albert_dist.data.prepare.dedup import DEDUP_ROW_BYTES

    out: dict[str, Any] = {"documents": documents}
    for name, budget in (("in_memory", 1 << 40), ("bucketed", documents * DEDUP_ROW_BYTES // 4)):
        folder = work / f"dedup-{name}"
        folder.mkdir()
        proc = subprocess.run([sys.executable, "-c", _DEDUP_DRIVER, str(folder), str(documents), str(budget)],
                              capture_output=True, text=True, cwd=ROOT)
        line = next((ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT ")), None)
        if proc.returncode != 0 or line is None:
            raise RuntimeError(f"dedup driver failed:\n{proc.stderr[-2000:]}")
        res = json.loads(line[len("RESULT "):])
        out[name] = {"budget_bytes": budget, **res}
        shutil.rmtree(folder)
    out["in_memory_bytes_per_document"] = out["in_memory"]["extra_rss_bytes"] / documents
    out["bucketed_peak_over_budget"] = out["bucketed"]["extra_rss_bytes"] / out["bucketed"]["budget_bytes"]
    return out


def block_compression() -> dict[str, float]:
    """Compression ratio of real text (WikiText-2 test + validation, Shakespeare: 3.5 MB) cut in row-group-sized
    blocks, at the zstd level prepare writes (`SHARD_ZSTD_LEVEL`) and at level 3, against one zstd level-3
    stream (a .zst file)."""
    import zstandard

    from albert_dist.data.prepare.write import SHARD_ZSTD_LEVEL

    paths = [CORPORA / "wikitext-2" / "test.txt", CORPORA / "wikitext-2" / "valid.txt",
             CORPORA / "tinyshakespeare" / "input.txt"]
    data = b"".join(p.read_bytes() for p in paths if p.exists()) or \
        b"".join(p.read_bytes() for p in sorted((ROOT / "data" / "sample").glob("wikitext-2-*.txt")))
    c = zstandard.ZstdCompressor(level=3)
    out = {"text_bytes": len(data), "one_stream": len(data) / len(c.compress(data)), "level": SHARD_ZSTD_LEVEL}
    for level, prefix in ((SHARD_ZSTD_LEVEL, "blocks"), (3, "level3_blocks")):
        c = zstandard.ZstdCompressor(level=level)
        for kib in (64, 256, 1024):
            step = kib << 10
            out[f"{prefix}_{kib}k"] = len(data) / sum(len(c.compress(data[i:i + step]))
                                                      for i in range(0, len(data), step))
    return out


def _prepare_from_s3(corpus: Path, work: Path, raw: int, local: dict[str, Any]) -> dict[str, Any]:
    """`data prepare --workers 1` of the same corpus uploaded to a real S3 endpoint on localhost (moto's server
    in its own process, tests/fixtures/s3_server.py: its CPU is the store's, not counted), into a local output:
    MB per CPU-second of the prepare process, and whether the shards equal the local run's."""
    sys.path.insert(0, str(ROOT / "tests"))
    from fixtures.s3_server import S3Server

    server = S3Server(process=True)
    try:
        server.bucket("raw")
        server.upload(corpus, "s3://raw/prepare")
        out = work / "prepared-s3"
        m = _driver(_PREPARE_DRIVER, ["--input", "s3://raw/prepare/*", "--output", str(out), "--workers", "1",
                                      "--no-progress", "--tokenizer", "none"], env=server.env())
        manifest = json.loads((out / "manifest.json").read_text())
        shutil.rmtree(out)
    finally:
        server.stop()
    return {"mb_per_cpu_s": raw / 1e6 / m["cpu_s"], "mb_per_wall_s": raw / 1e6 / m["wall_s"], "cpu_s": m["cpu_s"],
            "wall_s": m["wall_s"], "same_shards_as_local": [f["sha256"] for f in manifest["files"]] == local["sha256"]}


def prepare_section(work: Path, corpus_mb: int = 64, workers: tuple[int, ...] = (1, 2),
                    peer: bool = True, s3: bool = True, files: int = 16, extras: bool = True) -> dict[str, Any]:
    """`data prepare` of a ``corpus_mb`` .jsonl.zst corpus of ``files`` files at each ``workers``: throughput and
    peak RSS; the HF datasets peers; with ``s3``, also ours reading the corpus from an S3 server against the peer's
    local read; with ``extras``, the duplicate search's memory and the block compression of real text."""
    corpus = work / "prepare-zst"
    files = make_corpus(corpus, corpus_mb * 10**6, files, "jsonl", ".zst", seed=9)
    raw = _text_bytes(files)
    disk = sum(f.stat().st_size for f in files)
    result: dict[str, Any] = {"input_text_bytes": raw, "input_disk_bytes": disk, "files": len(files)}
    for w in workers:
        out = work / f"prepared-w{w}"
        m = _driver(_PREPARE_DRIVER, ["--input", str(corpus / "*"), "--output", str(out), "--workers", str(w),
                                      "--no-progress", "--tokenizer", "none"])
        manifest = json.loads((out / "manifest.json").read_text())
        result[f"workers_{w}"] = {
            "mb_per_wall_s": raw / 1e6 / m["wall_s"], "mb_per_wall_s_per_worker": raw / 1e6 / m["wall_s"] / w,
            "mb_per_cpu_s": raw / 1e6 / m["cpu_s"], "wall_s": m["wall_s"], "cpu_s": m["cpu_s"],
            "minor_page_faults": m["minor_faults"], "main_peak_rss_bytes": manifest["peak_rss_bytes"]["main"],
            "worker_peak_rss_bytes": manifest["peak_rss_bytes"]["worker"],
            "documents": manifest["documents"], "row_groups": manifest["row_groups"],
            "output_disk_bytes": sum(f["file_bytes"] for f in manifest["files"]),
            "sha256": [f["sha256"] for f in manifest["files"]]}
        if w != workers[0]:
            shutil.rmtree(out)
    first = result[f"workers_{workers[0]}"]
    result["same_output_at_any_workers"] = all(result[f"workers_{w}"].pop("sha256") == first["sha256"]
                                               for w in workers[1:])
    local = {"sha256": first.pop("sha256", None)}
    if peer:
        m = _driver(_PEER_DRIVER, [str(corpus / "*"), str(work / "peer.parquet"), str(work / "hf-cache")])
        result["peer_datasets_json_to_parquet"] = {
            "mb_per_cpu_s": raw / 1e6 / m["cpu_s"], "mb_per_wall_s": raw / 1e6 / m["wall_s"], "cpu_s": m["cpu_s"],
            "wall_s": m["wall_s"], "peak_rss_bytes": m["peak_rss"], "rows": m["rows"]}
        result["ratio_mb_per_cpu_s_ours_over_peer"] = first["mb_per_cpu_s"] / result[
            "peer_datasets_json_to_parquet"]["mb_per_cpu_s"]
        shutil.rmtree(work / "hf-cache", ignore_errors=True)
        (work / "peer.parquet").unlink(missing_ok=True)
        m = _driver(_PEER_DEDUP_DRIVER, [str(corpus / "*"), str(work / "peer.parquet"), str(work / "hf-cache")])
        result["peer_datasets_dedup_map_filter_to_parquet"] = {
            "mb_per_cpu_s": raw / 1e6 / m["cpu_s"], "mb_per_wall_s": raw / 1e6 / m["wall_s"], "cpu_s": m["cpu_s"],
            "wall_s": m["wall_s"], "peak_rss_bytes": m["peak_rss"], "rows": m["rows"],
            "same_documents_as_ours": m["rows"] == first["documents"]}
        result["ratio_mb_per_cpu_s_ours_over_dedup_peer"] = first["mb_per_cpu_s"] / result[
            "peer_datasets_dedup_map_filter_to_parquet"]["mb_per_cpu_s"]
        shutil.rmtree(work / "hf-cache", ignore_errors=True)
        (work / "peer.parquet").unlink(missing_ok=True)
        if s3:
            result["from_s3"] = _prepare_from_s3(corpus, work, raw, local)
            result["ratio_mb_per_cpu_s_ours_from_s3_over_peer"] = result["from_s3"]["mb_per_cpu_s"] / result[
                "peer_datasets_json_to_parquet"]["mb_per_cpu_s"]
            result["ratio_mb_per_cpu_s_ours_from_s3_over_dedup_peer"] = result["from_s3"]["mb_per_cpu_s"] / result[
                "peer_datasets_dedup_map_filter_to_parquet"]["mb_per_cpu_s"]
    shutil.rmtree(work / f"prepared-w{workers[0]}", ignore_errors=True)
    shutil.rmtree(corpus, ignore_errors=True)
    if extras:
        result["dedup_memory"] = dedup_memory(work)
        result["block_compression"] = block_compression()
    return result


def prepare_sections(work: Path, full: bool, ten_gb: bool) -> dict[str, Any]:
    """The ``prepare`` section at 64 MB (suite) or 1 GB (``full``); with ``ten_gb`` also 10 GB (64 files,
    ``--workers 1`` and both peers, no S3), under the key ``ten_gb``: the row groups outgrow their 64 KiB floor
    there (`albert_dist.data.prepare.options.shard_sizes`), so the per-row-group costs weigh less."""
    result = prepare_section(work, 1000 if full else 64)
    if ten_gb:
        result["ten_gb"] = prepare_section(work, 10_000, workers=(1,), s3=False, files=64, extras=False)
    return result




# ------------------------------------------------------------------------------------------------ entry points
def _sections(full: bool, ten_gb: bool = False) -> dict[str, Callable[[Path], dict[str, Any]]]:
    return {
        "amplification": lambda w: amplification_section(w, corpus_mb=256 if full else 40),
        "throughput": lambda w: throughput_section(w, small_mb=64 if full else 16, large_mb=1000 if full else 128,
                                                   tokens=2_000_000 if full else 600_000),
        "startup": lambda w: startup_section(w),
        "plan": lambda w: plan_section(w),
        "tokenizer": lambda w: tokenizer_section(w, (100, 1000) if full else (100,), ten_gb=full and ten_gb,
                                                 slope=full),
        "prepare": lambda w: prepare_sections(w, full, full and ten_gb),
    }


SECTIONS = ("amplification", "throughput", "startup", "plan", "tokenizer", "prepare")


def run(repeats: int = 1, full: bool = False, only: tuple[str, ...] = (), workdir: Optional[str] = None,
        ten_gb: bool = False) -> dict:
    """Every section of `SECTIONS` (or ``only``) at the suite's sizes (``full``: the issue's); ``repeats`` is
    accepted for bench/run_all.py: the throughput section repeats itself, the others are single measurements of
    deterministic quantities (bytes read, plan sizes) or of whole runs."""
    del repeats
    work = Path(tempfile.mkdtemp(prefix="data_scale-", dir=workdir))
    sections = _sections(full, ten_gb)
    result: dict[str, Any] = {"full": full, "load_average_start": os.getloadavg()[0]}
    try:
        for name in SECTIONS:
            if not only or name in only:
                t0 = time.perf_counter()
                result[name] = sections[name](work)
                result[name]["section_wall_s"] = round(time.perf_counter() - t0, 1)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    result["load_average_end"] = os.getloadavg()[0]
    return result


def _gb(n: float) -> str:
    return f"{n / 1e9:.2f} GB"


def _print_prepare(prep: dict[str, Any]) -> None:
    print(f"prepare of {prep['files']} .zst files, {prep['input_text_bytes'] / 1e6:.0f} MB decompressed "
          f"({prep['input_disk_bytes'] / 1e6:.0f} MB on disk):")
    for key, row in prep.items():
        if key.startswith("workers_"):
            print(f"  --workers {key[8:]}: {row['mb_per_wall_s']:.1f} MB/s wall ({row['mb_per_wall_s_per_worker']:.1f}"
                  f" per worker), {row['mb_per_cpu_s']:.1f} MB/CPU-s; peak RSS main {_gb(row['main_peak_rss_bytes'])},"
                  f" worker {_gb(row['worker_peak_rss_bytes'])}; {row['row_groups']} row groups; "
                  f"{row.get('minor_page_faults', 0):,} minor page faults")
    if "peer_datasets_json_to_parquet" in prep:
        p = prep["peer_datasets_json_to_parquet"]
        print(f"  peer datasets json->parquet: {p['mb_per_cpu_s']:.1f} MB/CPU-s, peak RSS {_gb(p['peak_rss_bytes'])};"
              f" ours / peer (MB per CPU-s) {prep['ratio_mb_per_cpu_s_ours_over_peer']:.2f}")
    if "peer_datasets_dedup_map_filter_to_parquet" in prep:
        p = prep["peer_datasets_dedup_map_filter_to_parquet"]
        print(f"  peer datasets json->map(hash)->filter(first)->parquet: {p['mb_per_cpu_s']:.1f} MB/CPU-s, peak RSS "
              f"{_gb(p['peak_rss_bytes'])}, {p['rows']:,} documents (ours: same count {p['same_documents_as_ours']}); "
              f"ours / this peer (MB per CPU-s) {prep['ratio_mb_per_cpu_s_ours_over_dedup_peer']:.2f}")
    if "from_s3" in prep:
        s = prep["from_s3"]
        print(f"  ours from S3 (moto server, local output): {s['mb_per_cpu_s']:.1f} MB/CPU-s, "
              f"{s['mb_per_wall_s']:.1f} MB/s wall; ours from S3 / peer from local disk (MB per CPU-s) "
              f"{prep['ratio_mb_per_cpu_s_ours_from_s3_over_peer']:.2f} (over the deduplicating peer "
              f"{prep['ratio_mb_per_cpu_s_ours_from_s3_over_dedup_peer']:.2f}); same shards as local: "
              f"{s['same_shards_as_local']}")
    if len([k for k in prep if k.startswith("workers_")]) > 1:
        print(f"  byte-identical output at every --workers: {prep['same_output_at_any_workers']}")
    if "block_compression" not in prep:
        return
    bc = prep["block_compression"]
    print(f"  zstd ratio of real text ({bc['text_bytes'] / 1e6:.1f} MB): one level-3 stream {bc['one_stream']:.2f}x; "
          f"blocks of 64 KiB / 256 KiB / 1 MiB at level {bc['level']} (prepare's) {bc['blocks_64k']:.2f}x / "
          f"{bc['blocks_256k']:.2f}x / {bc['blocks_1024k']:.2f}x, at level 3 {bc['level3_blocks_64k']:.2f}x / "
          f"{bc['level3_blocks_256k']:.2f}x / {bc['level3_blocks_1024k']:.2f}x")
    dd = prep["dedup_memory"]
    print(f"  duplicate search over {dd['documents']:,} hashes: {dd['in_memory_bytes_per_document']:.1f} bytes per "
          f"document in memory; bucketed under a {dd['bucketed']['budget_bytes'] / 2**20:.0f} MiB budget: peak "
          f"{dd['bucketed_peak_over_budget']:.2f} x the budget")


def _print(res: dict[str, Any]) -> None:
    print(f"load average {res['load_average_start']:.1f} at start, {res['load_average_end']:.1f} at end")
    amp = res.get("amplification")
    if amp:
        print(f"read amplification, {amp['corpus_mb']} MB corpora (measured / planned; slots 1, 8, 64, 512):")
        for name, row in amp.items():
            if isinstance(row, dict) and "1" in row:
                cells = "  ".join(f"{row[s]['measured']:6.2f} / {row[s]['planned']:6.2f}" for s in map(str, SLOT_COUNTS))
                print(f"  {name:<32} {row['files']:>5} files: {cells}")
            elif name == "after_prepare":
                print(f"  after prepare: {row}")
        if amp.get("max_after_prepare") is not None:
            print(f"  after prepare, max {amp['max_after_prepare']:.3f} <= {AMPLIFICATION_TARGET}: "
                  f"{amp['within_target_after_prepare']}")
    tp = res.get("throughput")
    if tp:
        print(f"one slot's tokens per CPU-second, {tp['large_mb']} MB ({tp['large_files']} files) vs {tp['small_mb']} MB "
              f"({tp['small_files']} files): " + ", ".join(
                  f"{a / 1e3:.0f}k vs {b / 1e3:.0f}k = {r:.3f}" for a, b, r in zip(
                      tp["tokens_per_cpu_s_large"], tp["tokens_per_cpu_s_small"], tp["ratio_large_over_small"]))
              + f"; >= {THROUGHPUT_TARGET}: {tp['within_target']}")
    st = res.get("startup")
    if st:
        m, s = st["many_files"], st["bundled_sample"]
        print(f"1-step train over {st['files']} .jsonl files: {m['wall_s']:.1f} s wall, {m['cpu_s']:.1f} CPU-s; "
              f"bundled sample: {s['wall_s']:.1f} s, {s['cpu_s']:.1f} CPU-s; <= {STARTUP_TARGET_S:.0f} s: "
              f"{st['within_target']}")
    tok = res.get("tokenizer")
    if tok:
        print(f"tokenizer train, vocab {VOCAB}, defaults (peak RSS / CPU s / wall s):")
        for size, row in tok.items():
            if not isinstance(row, dict) or "ours" not in row:
                continue
            o = row["ours"]
            line = f"  {size:>6}: ours {_gb(o['peak_rss_bytes'])} / {o['cpu_s']:.0f} / {o['wall_s']:.0f}"
            if "peer_reservoir_2m_sentences" in row:
                p = row["peer_reservoir_2m_sentences"]
                line += (f";  peer (all text, 2M-sentence reservoir) {_gb(p['peak_rss_bytes'])} / {p['cpu_s']:.0f}"
                         f" / {p['wall_s']:.0f};  RSS ratio {row['ratio_rss_ours_over_peer']:.2f}")
            print(line)
        print(f"  peak RSS <= 2 GB everywhere: {tok['peak_rss_within_target']}")
        if "rss_bytes_per_sample_byte" in tok:
            print("  peak RSS by --sample-bytes (100 MB corpus): " + ", ".join(
                f"{k} MiB {_gb(v)}" for k, v in tok["rss_by_sample_mib"].items())
                + f"; {tok['rss_bytes_per_sample_byte']:.1f} bytes of RSS per byte of sample")
    prep = res.get("prepare")
    if prep:
        _print_prepare(prep)
        if "ten_gb" in prep:
            _print_prepare(prep["ten_gb"])
    pl = res.get("plan")
    if pl:
        for name in ("jsonl_1tb", "jsonl_zst"):
            r = pl[name]
            print(f"data plan, {pl['files']} files ({name}), {pl['ranks']} x {pl['workers']} slots: "
                  f"{r['wall_s']:.1f} s wall ({r['plan_s']:.1f} s planning), {r['pieces']} pieces, "
                  f"{r['bytes'] / 1e12:.3f} TB, amplification {r['amplification']:.2f}")


def main(argv: Optional[list[str]] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--full", action="store_true", help="the issue's sizes (1 GB vs 64 MB, 256 MB corpora)")
    parser.add_argument("--10g", dest="ten_gb", action="store_true", help="with --full: the tokenizer and prepare on 10 GB too")
    parser.add_argument("--only", nargs="+", default=[], choices=SECTIONS)
    parser.add_argument("--workdir", default=None, help="where the generated corpora go (deleted after)")
    parser.add_argument("--json", help="also write the result to this file")
    args = parser.parse_args(argv)
    res = run(full=args.full, only=tuple(args.only), workdir=args.workdir, ten_gb=args.ten_gb)
    if args.json:  # first: a figure that fails to print is still kept
        Path(args.json).write_text(json.dumps(res, indent=2) + "\n")
    _print(res)
    return 0


if __name__ == "__main__":
    sys.exit(main())
