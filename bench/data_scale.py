"""Data at the sizes users run (issue 19): read amplification per cluster size, per-slot throughput against corpus
size, start-up with many files, the plan of a 1,024 x 8-slot job.

    python bench/data_scale.py                       # the suite's sizes (bench/run_all.py; ~2 min on 2 cores)
    python bench/data_scale.py --full                # the issue's sizes: 1 GB vs 64 MB, 256 MB corpora
    python bench/data_scale.py --only amplification  # one section: amplification | throughput | startup | plan

Corpora are generated under ``--workdir`` (default: a temporary directory, deleted afterwards) from the real text
of ``/work/shared/corpora`` (the bundled sample where that is absent): WikiText-2 paragraphs and Shakespeare
speaker turns, 2-6 per document, three words replaced at random and a document number appended (distinct
documents, text that compresses like text).

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

The prepare helper's sections (``albert-dist data prepare`` throughput; tokenizer training peak RSS and time at
100 MB and 1 GB) go in the marked place below `plan_section`; ``run`` calls every section in `SECTIONS`.
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
CORPORA = Path("/work/shared/corpora")
SLOT_COUNTS = (1, 8, 64, 512)
AMPLIFICATION_TARGET = 1.1
THROUGHPUT_TARGET = 0.9
STARTUP_TARGET_S = 30.0
RECIPE = "configs/pretrain/albert-tiny-wikitext.yaml"


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
    from albert_dist.data.paths import read_amplification
    from albert_dist.data.stream import plan_source

    source = SourceConfig(paths=[pattern])
    cap = DataConfig().shard_piece_bytes
    warm = plan_source(source, "bench", cap, 1)
    _slot_epoch_bytes(source, warm[:1], 0, 1)  # warm-up: imports and first-use reads are not the corpus's
    out: dict[str, Any] = {}
    for slots in slot_counts:
        pieces = plan_source(source, "bench", cap, slots)  # the job's own plan for this many slots
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


# ------------------------------------------------------------------------------------------------ prepare helper
# The prepare helper's sections go here: `albert-dist data prepare` throughput and the tokenizer's peak RSS and
# time at 100 MB and 1 GB (issue 19, item 5). Add `name: function(work, full) -> dict` to SECTIONS below.


# ------------------------------------------------------------------------------------------------ entry points
def _sections(full: bool) -> dict[str, Callable[[Path], dict[str, Any]]]:
    return {
        "amplification": lambda w: amplification_section(w, corpus_mb=256 if full else 40),
        "throughput": lambda w: throughput_section(w, small_mb=64 if full else 16, large_mb=1000 if full else 128,
                                                   tokens=2_000_000 if full else 600_000),
        "startup": lambda w: startup_section(w),
        "plan": lambda w: plan_section(w),
    }


SECTIONS = ("amplification", "throughput", "startup", "plan")


def run(repeats: int = 1, full: bool = False, only: tuple[str, ...] = (), workdir: Optional[str] = None) -> dict:
    """Every section of `SECTIONS` (or ``only``) at the suite's sizes (``full``: the issue's); ``repeats`` is
    accepted for bench/run_all.py: the throughput section repeats itself, the others are single measurements of
    deterministic quantities (bytes read, plan sizes) or of whole runs."""
    del repeats
    work = Path(tempfile.mkdtemp(prefix="data_scale-", dir=workdir))
    sections = _sections(full)
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
    parser.add_argument("--only", nargs="+", default=[], choices=SECTIONS)
    parser.add_argument("--workdir", default=None, help="where the generated corpora go (deleted after)")
    parser.add_argument("--json", help="also write the result to this file")
    args = parser.parse_args(argv)
    res = run(full=args.full, only=tuple(args.only), workdir=args.workdir)
    _print(res)
    if args.json:
        Path(args.json).write_text(json.dumps(res, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
