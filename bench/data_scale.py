"""Data at the sizes users run (issue 19): tokenizer memory, `data prepare` throughput, read amplification.

    python bench/data_scale.py                    # the suite's sizes (~2 min on 2 idle cores)
    python bench/data_scale.py --full             # tokenizer at 100 MB and 1 GB, prepare at 64 MB and 1 GB
    python bench/data_scale.py --full --10g       # + tokenizer on a 10 GB corpus
    python bench/data_scale.py --only tokenizer   # one section (tokenizer | prepare | amplification)

Corpora are generated under a temporary directory (``--workdir``, default $TMPDIR) from the real text in
``/work/shared/corpora`` (or the bundled sample when that is absent): WikiText-2 paragraphs and Shakespeare turns,
2-6 per document, three words per document replaced at random and a document number appended, so that exact
deduplication keeps every document. The 10 GB corpus is the 1 GB one's files hard-linked ten times over (400
files, 1 GB on disk): the tokenizer's sampler reads every path, and its memory does not depend on what is in them.

Sections (each returns a dict; ``run`` merges them for bench/run_all.py):

* ``tokenizer``: ``albert-dist tokenizer train --vocab-size 8000`` with the defaults (a byte-budgeted sample from
  every file) in a fresh process per corpus size: peak RSS (``wait4``), CPU and wall seconds. Peer, same run: the
  previous behaviour, every document streamed into sentencepiece's own reservoir of 2M sentences
  (``--sample-bytes`` above the corpus and ``--input-sentence-size 2000000``). Target (issue 19): peak RSS <= 2 GB
  at 1 GB and 10 GB.
* ``prepare``: ``albert-dist data prepare`` of a ``.jsonl.zst`` corpus (16 files) at ``--workers`` 1 and 2: input
  text MB per wall second and per CPU-second (all processes), peak RSS of the main process and of the largest
  worker. Peer, same run and corpus: HF datasets' ``load_dataset("json").to_parquet()`` (what a user would write
  by hand; it neither deduplicates nor sizes row groups).
* ``amplification``: read amplification of the same ``.jsonl.zst`` corpus before and after ``prepare`` at 1, 8,
  64 and 512 slots (ranks x loader workers): bytes the training streams read from storage in one epoch
  (``/proc/self/io`` rchar) summed over slots, divided by the corpus's bytes on disk. Slots are symmetric, so
  above 16 slots 16 evenly spaced slots are read and the sum is scaled by slots / 16. Target: <= 1.1 after.
"""
from __future__ import annotations

import argparse
import json
import os
import random
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Optional

ROOT = Path(__file__).resolve().parents[1]
CORPORA = Path("/work/shared/corpora")
VOCAB = 8000
AMPLIFICATION_SLOTS = (1, 8, 64, 512)
MEASURED_SLOTS = 16
TOKENIZER_TARGET_BYTES = 2 * 10**9
AMPLIFICATION_TARGET = 1.1


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
                paras.append(re.sub(r" @(.)@ ", r"\1", line).replace("<unk>", ""))
    shakespeare = CORPORA / "tinyshakespeare" / "input.txt"
    if shakespeare.exists():
        paras += [t.replace("\n", " ") for t in shakespeare.read_text().split("\n\n") if len(t) > 40]
    return paras


def make_corpus(out: Path, total_bytes: int, files: int, kind: str = "txt", compression: str = "",
                seed: int = 0) -> list[Path]:
    """``files`` files of about ``total_bytes / files`` bytes of text each (before compression) in ``out``:
    ``kind`` "txt" (blank-line documents) or "jsonl" ({"text": ...}), ``compression`` "" or ".zst". Every
    document is distinct (see the module docstring). Returns the paths."""
    import zstandard

    out.mkdir(parents=True, exist_ok=True)
    rng = random.Random(seed)
    paras = _paragraphs()
    words = sorted({w for p in paras[:3000] for w in p.split()})
    per_file = total_bytes // files
    doc_id = 0
    paths = []
    for i in range(files):
        path = out / f"part-{i:05d}.{kind}{compression}"
        sink = open(path, "wb")
        writer = zstandard.ZstdCompressor(level=3).stream_writer(sink) if compression == ".zst" else sink
        written = 0
        while written < per_file:
            chunk = []
            for _ in range(256):
                ps = rng.choices(paras, k=rng.randint(2, 6))
                w = ps[0].split()
                for _ in range(3):
                    w[rng.randrange(len(w))] = rng.choice(words)
                ps[0] = " ".join(w) + f" ({doc_id})"
                doc_id += 1
                doc = "\n".join(ps)
                chunk.append(json.dumps({"text": doc}) if kind == "jsonl" else doc)
            data = (("\n" if kind == "jsonl" else "\n\n").join(chunk) + ("\n" if kind == "jsonl" else "\n\n")).encode()
            writer.write(data)
            written += len(data)
        writer.close()
        if sink is not writer:
            sink.close()
        paths.append(path)
    return paths


def _cli() -> list[str]:
    return [sys.executable, "-m", "albert_dist.cli"]


def _measure(cmd: list[str], env: Optional[dict] = None) -> dict[str, Any]:
    """Run ``cmd`` to completion; its peak RSS (largest of it and its children, bytes), CPU and wall seconds."""
    t0 = time.perf_counter()
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            env={**os.environ, **(env or {})}, cwd=ROOT)
    out = proc.stdout.read()
    _, status, usage = os.wait4(proc.pid, 0)
    proc.returncode = os.waitstatus_to_exitcode(status)
    wall = time.perf_counter() - t0
    if proc.returncode != 0:
        raise RuntimeError(f"{cmd} exited {proc.returncode}:\n{out[-3000:]}")
    return {"peak_rss_bytes": usage.ru_maxrss * 1024, "cpu_s": usage.ru_utime + usage.ru_stime, "wall_s": wall,
            "output": out}


# ------------------------------------------------------------------------------------------------ tokenizer
def tokenizer_section(work: Path, sizes_mb: tuple[int, ...] = (100,), peer: bool = True,
                      ten_gb: bool = False) -> dict[str, Any]:
    """Peak RSS / CPU / wall of `tokenizer train` (defaults, vocab 8000) per corpus size, ours and the peer."""
    result: dict[str, Any] = {}
    for mb in sizes_mb:
        corpus = work / f"tok{mb}m"
        make_corpus(corpus, mb * 10**6, 40, "txt")
        row = {}
        base = _cli() + ["tokenizer", "train", "--input", str(corpus / "*.txt"), "--vocab-size", str(VOCAB)]
        m = _measure(base + ["--output", str(work / "tok-ours")])
        budget = re.search(r"sample budget ([\d.]+ MiB)", m["output"])
        row["ours"] = {k: m[k] for k in ("peak_rss_bytes", "cpu_s", "wall_s")}
        row["ours"]["budget"] = budget.group(1) if budget else None
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
_PREPARE_DRIVER = """
import json, resource, sys
from albert_dist.data_cli import prepare_cli
rc = prepare_cli(sys.argv[1:])
me, kids = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
print("RUSAGE " + json.dumps({"rc": rc, "main_rss": me.ru_maxrss * 1024, "worker_rss": kids.ru_maxrss * 1024,
      "cpu_s": me.ru_utime + me.ru_stime + kids.ru_utime + kids.ru_stime}))
"""

_PEER_DRIVER = """
import json, resource, sys, glob
import datasets
datasets.disable_progress_bars()
files, out, cache = sys.argv[1], sys.argv[2], sys.argv[3]
ds = datasets.load_dataset("json", data_files=sorted(glob.glob(files)), split="train", cache_dir=cache)
ds.to_parquet(out)
me, kids = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
print("RUSAGE " + json.dumps({"rc": 0, "main_rss": me.ru_maxrss * 1024, "worker_rss": kids.ru_maxrss * 1024,
      "cpu_s": me.ru_utime + me.ru_stime + kids.ru_utime + kids.ru_stime, "rows": ds.num_rows}))
"""


def _driver(code: str, args: list[str]) -> dict[str, Any]:
    t0 = time.perf_counter()
    proc = subprocess.run([sys.executable, "-c", code, *args], capture_output=True, text=True, cwd=ROOT,
                          env={**os.environ, "HF_DATASETS_OFFLINE": "1"})
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


def prepare_section(work: Path, corpus: Path, files: list[Path], workers: tuple[int, ...] = (1, 2),
                    peer: bool = True) -> dict[str, Any]:
    """`data prepare` of ``corpus`` at each ``workers``: throughput and peak RSS; the HF datasets peer."""
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
            "main_peak_rss_bytes": m["main_rss"], "worker_peak_rss_bytes": m["worker_rss"],
            "documents": manifest["documents"], "row_groups": manifest["row_groups"],
            "output_disk_bytes": sum(f["file_bytes"] for f in manifest["files"]),
            "sha256": [f["sha256"] for f in manifest["files"]]}
        if w != workers[0]:
            shutil.rmtree(out)
    first = result[f"workers_{workers[0]}"]
    result["same_output_at_any_workers"] = all(result[f"workers_{w}"].pop("sha256") == first["sha256"]
                                               for w in workers[1:])
    first.pop("sha256", None)
    if peer:
        m = _driver(_PEER_DRIVER, [str(corpus / "*"), str(work / "peer.parquet"), str(work / "hf-cache")])
        result["peer_datasets_json_to_parquet"] = {
            "mb_per_cpu_s": raw / 1e6 / m["cpu_s"], "mb_per_wall_s": raw / 1e6 / m["wall_s"], "cpu_s": m["cpu_s"],
            "wall_s": m["wall_s"], "peak_rss_bytes": max(m["main_rss"], m["worker_rss"]), "rows": m["rows"]}
        result["ratio_mb_per_cpu_s_ours_over_peer"] = first["mb_per_cpu_s"] / result[
            "peer_datasets_json_to_parquet"]["mb_per_cpu_s"]
        shutil.rmtree(work / "hf-cache", ignore_errors=True)
        (work / "peer.parquet").unlink(missing_ok=True)
    return result


# ------------------------------------------------------------------------------------------------ amplification
def _rchar() -> int:
    with open("/proc/self/io") as f:
        return int(next(line for line in f if line.startswith("rchar:")).split()[1])


class _EpochDone(Exception):
    pass


def epoch_bytes_read(source, pieces: list[dict], slots: int, slot: int) -> int:
    """Bytes this process reads from storage while slot ``slot`` of ``slots`` streams one epoch of ``source``
    (planned as ``pieces``)."""
    from albert_dist.data.config import DataConfig
    from albert_dist.data.stream import SourceStream

    class OneEpoch(SourceStream):
        def _end_epoch(self) -> None:  # stop at the end of epoch 0 instead of starting the next one
            raise _EpochDone

    before = _rchar()
    stream = OneEpoch(source, "bench", pieces, slot, slots, seed=0, shuffle=True,
                      max_document_bytes=DataConfig().max_document_bytes)
    try:
        while True:
            stream.next_document()
    except _EpochDone:
        pass
    return _rchar() - before


def amplification(source_paths: str, disk_bytes: int, slots_list=AMPLIFICATION_SLOTS) -> dict[str, Any]:
    """Per slot count: the read amplification of one epoch (sum over slots of `epoch_bytes_read` / bytes on
    disk) and the bytes one rank reads to plan the pieces (file sizes, parquet footers), once per job start. The
    slots read after their rank planned, as forked DataLoader workers do (parquet footers already parsed)."""
    from albert_dist.data.config import DataConfig, SourceConfig
    from albert_dist.data.paths import _parquet_metadata
    from albert_dist.data.stream import plan_source

    source = SourceConfig(paths=[source_paths])
    piece_bytes = DataConfig().shard_piece_bytes
    epoch_bytes_read(source, plan_source(source, "bench", piece_bytes, 1), 1, 0)  # warm-up: imports, first reads
    out: dict[str, Any] = {"epoch": {}, "planning_bytes_per_rank": {}}
    for slots in slots_list:
        _parquet_metadata.cache_clear()  # each slot count as a fresh rank: planning reads every footer
        before = _rchar()
        pieces = plan_source(source, "bench", piece_bytes, slots)
        out["planning_bytes_per_rank"][str(slots)] = _rchar() - before
        measured = sorted({(i * slots) // MEASURED_SLOTS for i in range(min(slots, MEASURED_SLOTS))})
        total = sum(epoch_bytes_read(source, pieces, slots, s) for s in measured)
        out["epoch"][str(slots)] = total * (slots / len(measured)) / disk_bytes
    return out


def amplification_section(work: Path, corpus: Path, files: list[Path]) -> dict[str, Any]:
    """.jsonl.zst before and after prepare (the output of prepare_section with 1 worker, or made here)."""
    prepared = work / "prepared-w1"
    if not (prepared / "manifest.json").exists():
        _driver(_PREPARE_DRIVER, ["--input", str(corpus / "*"), "--output", str(prepared), "--workers", "1",
                                  "--no-progress", "--tokenizer", "none"])
    shards = sorted(prepared.glob("*.parquet"))
    before = amplification(str(corpus / "*"), sum(f.stat().st_size for f in files))
    after = amplification(str(prepared / "*.parquet"), sum(f.stat().st_size for f in shards))
    return {"before": before["epoch"], "after_prepare": after["epoch"],
            "planning_bytes_per_rank_before": before["planning_bytes_per_rank"],
            "planning_bytes_per_rank_after": after["planning_bytes_per_rank"],
            "disk_bytes_before": sum(f.stat().st_size for f in files),
            "disk_bytes_after": sum(f.stat().st_size for f in shards),
            "max_after": max(after["epoch"].values()), "target_after": AMPLIFICATION_TARGET,
            "within_target": max(after["epoch"].values()) <= AMPLIFICATION_TARGET,
            "corpus": f"{len(files)} {files[0].name.split('.', 1)[1]} files", "row_groups_after": json.loads(
                (prepared / "manifest.json").read_text())["row_groups"]}


# ------------------------------------------------------------------------------------------------ entry points
def run(repeats: int = 1, tokenizer_mb: tuple[int, ...] = (100,), tokenizer_peer: bool = True,
        prepare_mb: int = 64, ten_gb: bool = False, only: tuple[str, ...] = (),
        workdir: Optional[str] = None, kind: str = "jsonl") -> dict[str, Any]:
    """The sections above at the given sizes (the suite's by default); ``repeats`` is accepted for run_all and
    ignored: each figure is one measurement of a minutes-long job, and RSS peaks do not need repeating."""
    del repeats
    work = Path(tempfile.mkdtemp(prefix="data_scale-", dir=workdir))
    result: dict[str, Any] = {"load_average_start": os.getloadavg()[0]}
    try:
        if not only or "tokenizer" in only:
            result["tokenizer"] = tokenizer_section(work, tuple(tokenizer_mb), tokenizer_peer, ten_gb)
        if not only or {"prepare", "amplification"} & set(only):
            corpus = work / "zst"
            files = make_corpus(corpus, prepare_mb * 10**6, 16, kind, ".zst", seed=1)
            if not only or "prepare" in only:
                result["prepare"] = prepare_section(work, corpus, files, peer=kind == "jsonl")
            if not only or "amplification" in only:
                result["amplification"] = amplification_section(work, corpus, files)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    result["load_average_end"] = os.getloadavg()[0]
    return result


def _gb(n: float) -> str:
    return f"{n / 1e9:.2f} GB"


def _print(res: dict[str, Any]) -> None:
    print(f"load average {res['load_average_start']:.1f} at start, {res['load_average_end']:.1f} at end")
    tok = res.get("tokenizer")
    if tok:
        print(f"tokenizer train, vocab {VOCAB}, defaults (peak RSS / CPU s / wall s):")
        for size, row in tok.items():
            if not isinstance(row, dict):
                continue
            o = row["ours"]
            line = f"  {size:>6}: ours {_gb(o['peak_rss_bytes'])} / {o['cpu_s']:.0f} / {o['wall_s']:.0f}"
            if "peer_reservoir_2m_sentences" in row:
                p = row["peer_reservoir_2m_sentences"]
                line += (f";  peer (all text, 2M-sentence reservoir) {_gb(p['peak_rss_bytes'])} / {p['cpu_s']:.0f}"
                         f" / {p['wall_s']:.0f};  RSS ratio {row['ratio_rss_ours_over_peer']:.2f}")
            print(line)
        print(f"  peak RSS <= 2 GB everywhere: {tok['peak_rss_within_target']}")
    prep = res.get("prepare")
    if prep:
        print(f"prepare of {prep['files']} .zst files, {prep['input_text_bytes'] / 1e6:.0f} MB decompressed "
              f"({prep['input_disk_bytes'] / 1e6:.0f} MB on disk):")
        for key, row in prep.items():
            if key.startswith("workers_"):
                print(f"  --workers {key[8:]}: {row['mb_per_wall_s']:.1f} MB/s wall ({row['mb_per_wall_s_per_worker']:.1f}"
                      f" per worker), {row['mb_per_cpu_s']:.1f} MB/CPU-s; peak RSS main {_gb(row['main_peak_rss_bytes'])},"
                      f" worker {_gb(row['worker_peak_rss_bytes'])}; {row['row_groups']} row groups")
        if "peer_datasets_json_to_parquet" in prep:
            p = prep["peer_datasets_json_to_parquet"]
            print(f"  peer datasets json->parquet: {p['mb_per_cpu_s']:.1f} MB/CPU-s, peak RSS {_gb(p['peak_rss_bytes'])};"
                  f" ours / peer (MB per CPU-s) {prep['ratio_mb_per_cpu_s_ours_over_peer']:.2f}")
        print(f"  byte-identical output at every --workers: {prep['same_output_at_any_workers']}")
    amp = res.get("amplification")
    if amp:
        print(f"read amplification, {amp['corpus']} (slots: before -> after prepare, {amp['row_groups_after']} row groups):")
        for slots in amp["before"]:
            print(f"  {slots:>4} slots: {amp['before'][slots]:7.2f} -> {amp['after_prepare'][slots]:.3f}   (planning "
                  f"reads per rank {amp['planning_bytes_per_rank_before'][slots] / 1e6:.2f} -> "
                  f"{amp['planning_bytes_per_rank_after'][slots] / 1e6:.2f} MB)")
        print(f"  after prepare <= {amp['target_after']}: {amp['within_target']}")


def main(argv: Optional[list[str]] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--full", action="store_true", help="tokenizer at 100 MB and 1 GB, prepare at 1 GB")
    parser.add_argument("--10g", dest="ten_gb", action="store_true", help="with --full: tokenizer on 10 GB too")
    parser.add_argument("--no-peer", action="store_true", help="skip the tokenizer peer (the old reservoir)")
    parser.add_argument("--only", nargs="+", default=[], choices=("tokenizer", "prepare", "amplification"))
    parser.add_argument("--workdir", default=None, help="where the generated corpora go (deleted after)")
    parser.add_argument("--kind", default="jsonl", choices=("jsonl", "txt"), help="the .zst corpus's format")
    parser.add_argument("--json", help="also write the result to this file")
    args = parser.parse_args(argv)
    res = run(tokenizer_mb=(100, 1000) if args.full else (100,), tokenizer_peer=not args.no_peer,
              prepare_mb=1000 if args.full else 64, ten_gb=args.full and args.ten_gb, only=tuple(args.only),
              workdir=args.workdir, kind=args.kind)
    _print(res)
    if args.json:
        Path(args.json).write_text(json.dumps(res, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
