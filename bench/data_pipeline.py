"""Data-pipeline throughput on one core: albert_dist's stream vs transformers' run_mlm recipe, same run, same text.

Ours: the whole pipeline of one rank, in-process (``num_workers=0``): read shards -> sentences -> sentencepiece
-> SOP pairs -> whole-word n-gram masking -> padded (B, S) int64 tensors, S = 512, over the bundled WikiText-2
train shards. Baseline (does less: no sentences, no SOP, no n-grams): transformers' ``AlbertTokenizer`` (fast,
``tokenizers``-backed) on the same ``spiece.model``, examples/pytorch/language-modeling/run_mlm.py's
``group_texts`` (concatenate, cut into 512-token blocks) and ``DataCollatorForLanguageModeling`` (15%), on the
same documents already in memory. Throughput counts real (non-padding) tokens per CPU-second of the
process (``time.process_time``: the machine may be shared, and one core is what is measured); wall-clock
figures are returned too. The two alternate
repeat by repeat; the process is pinned to one CPU core, with one thread everywhere.

Chinese case (issue 27), when the zhwiki sample is there (``--zh-corpus``; default data/zhwiki/zhwiki.jsonl,
else ../shared/corpora/zhwiki-sample/zhwiki.jsonl): the Chinese recipe's tokenizer (data/zhwiki/spiece.model:
8000 pieces, coverage 0.9995, full-width forms kept), the same two pipelines on its documents of >= 20
characters, and ours twice, with
``chinese_word_segmentation`` "none" (character-level units) and "jieba" (rjieba words): the cost of
segmentation is their ratio in one run, and ours with segmentation must still be >= 2x the HF peer.

    python bench/data_pipeline.py [--repeats 5] [--zh-corpus PATH]
    python bench/data_pipeline.py --profile-zh      # where the CPU time of the Chinese case goes (cProfile)

``run(repeats=...)`` returns per-repeat lists (tokens/s of each, ratio ours/baseline) for bench/run_all.py.
Targets (issue 3): ratio >= 2 and ours >= 1e6 tokens/s; (issue 27) zh_ratio_words >= 2.
"""
from __future__ import annotations

import argparse
import json
import os
import tempfile
import time
from pathlib import Path

from _common import fmt_stats

SEQ = 512
BATCH = 32
ROOT = Path(__file__).resolve().parent.parent
ZH_CORPORA = (ROOT / "data/zhwiki/zhwiki.jsonl", ROOT.parent / "shared/corpora/zhwiki-sample/zhwiki.jsonl")
ZH_TOKENIZER = ROOT / "data/zhwiki/spiece.model"


def _pin_one_core() -> None:
    os.environ["OMP_NUM_THREADS"] = "1"
    os.environ["RAYON_NUM_THREADS"] = "1"
    os.environ["TOKENIZERS_PARALLELISM"] = "false"
    if hasattr(os, "sched_setaffinity"):
        os.sched_setaffinity(0, {min(os.sched_getaffinity(0))})


def _ours(cfg, num_tokens: int) -> tuple[int, float, float]:
    from albert_dist.data.loader import PretrainingStream

    stream = PretrainingStream(cfg, "train", BATCH, rank=0, world_size=1)
    it = iter(stream)
    next(it)  # warm-up: tokenizer load, datasets builder; not part of the steady state
    tokens, t0, c0 = 0, time.perf_counter(), time.process_time()
    while tokens < num_tokens:
        tokens += int(next(it)["attention_mask"].sum())
    return tokens, time.process_time() - c0, time.perf_counter() - t0


def _baseline(tokenizer, collator, texts: list[str]) -> tuple[int, float, float]:
    t0, c0 = time.perf_counter(), time.process_time()
    ids = tokenizer(texts, return_attention_mask=False, return_token_type_ids=False)["input_ids"]
    # run_mlm.py group_texts: concatenate everything and cut into blocks of max_seq_length (drop the remainder)
    flat = [t for seq in ids for t in seq]
    total = (len(flat) // SEQ) * SEQ
    blocks = [{"input_ids": flat[i : i + SEQ]} for i in range(0, total, SEQ)]
    tokens = 0
    for i in range(0, len(blocks), BATCH):
        batch = collator(blocks[i : i + BATCH])
        tokens += int(batch["input_ids"].numel())
    return tokens, time.process_time() - c0, time.perf_counter() - t0


def _sentencepiece_only(sp, texts: list[str]) -> tuple[int, float]:
    """Reference point: sentencepiece encoding alone of the same sentences (the floor of any such pipeline)."""
    from albert_dist.data.text import split_sentences

    sentences = [s for t in texts for s in split_sentences(t)]
    c0 = time.process_time()
    tokens = sum(map(len, sp.encode(sentences, num_threads=1)))
    return tokens, time.process_time() - c0


def _hf_peer(model_dir: str):
    """transformers' AlbertTokenizer on ``model_dir``'s spiece.model and run_mlm's collator (15%)."""
    from transformers import AlbertTokenizer, DataCollatorForLanguageModeling

    # transformers >= 5 builds the fast tokenizer from the directory's spiece.model; same normalisation as ours
    tokenizer = AlbertTokenizer.from_pretrained(model_dir, do_lower_case=False, keep_accents=True)
    return tokenizer, DataCollatorForLanguageModeling(tokenizer, mlm=True, mlm_probability=0.15, return_tensors="pt")


def _chinese(repeats: int, corpus: Path) -> dict:
    """The zhwiki case: ours without and with jieba words, and the HF peer, alternating repeat by repeat."""
    from albert_dist.data.config import DataConfig, SourceConfig

    with corpus.open(encoding="utf-8") as f:
        texts = [t for t in (json.loads(line)["text"] for line in f) if len(t) >= 20]
    with tempfile.TemporaryDirectory() as tmp:
        docs = Path(tmp) / "zhwiki.jsonl"  # the same documents the peer gets (>= 20 characters)
        docs.write_text("".join(json.dumps({"text": t}, ensure_ascii=False) + "\n" for t in texts), encoding="utf-8")
        tokenizer, collator = _hf_peer(str(ZH_TOKENIZER.parent))
        cfgs = {seg: DataConfig(train=[SourceConfig(paths=[str(docs)])], tokenizer_path=str(ZH_TOKENIZER), max_seq_length=SEQ,
                                num_workers=0, chinese_word_segmentation=seg) for seg in ("none", "jieba")}
        base, chars, words = [], [], []
        for _ in range(repeats):
            n, cpu, _ = _baseline(tokenizer, collator, texts)
            base.append(n / cpu)
            n_ours, cpu, _ = _ours(cfgs["none"], num_tokens=n)
            chars.append(n_ours / cpu)
            n_ours, cpu, _ = _ours(cfgs["jieba"], num_tokens=n)
            words.append(n_ours / cpu)
    return {"zh_documents": len(texts), "zh_characters": sum(map(len, texts)),
            "zh_baseline_tokens_per_s": base, "zh_ours_chars_tokens_per_s": chars, "zh_ours_words_tokens_per_s": words,
            "zh_ratio_words": [w / b for w, b in zip(words, base)],
            "zh_ratio_chars": [c / b for c, b in zip(chars, base)],
            "zh_words_over_chars": [w / c for w, c in zip(words, chars)], "zh_target_ratio_words": 2.0}


def profile_chinese(corpus: Path, documents: int = 2500) -> None:
    """Print the functions that take the CPU time of ``ExampleBuilder.build`` over the first ``documents``
    zhwiki documents with jieba words (cProfile with ``time.process_time``), and each one's share."""
    import cProfile
    import pstats

    import numpy as np

    from albert_dist.data.config import DataConfig
    from albert_dist.data.pretraining import ExampleBuilder
    from albert_dist.data.tokenizer import load_tokenizer

    _pin_one_core()
    with corpus.open(encoding="utf-8") as f:
        texts = [t for t in (json.loads(line)["text"] for line in f) if len(t) >= 20][:documents]
    builder = ExampleBuilder(load_tokenizer(str(ZH_TOKENIZER)),
                             DataConfig(max_seq_length=SEQ, chinese_word_segmentation="jieba"))
    builder.build(texts[0], np.random.default_rng(0))  # the segmenter's dictionary loads outside the profile
    rng = np.random.default_rng(0)
    prof = cProfile.Profile(time.process_time)
    prof.enable()
    for text in texts:
        builder.build(text, rng)
    prof.disable()
    stats = pstats.Stats(prof)
    total = stats.total_tt
    print(f"ExampleBuilder.build, jieba words, {len(texts)} zhwiki documents: {total:.2f} CPU-s; own / cumulative:")
    rows = sorted(stats.stats.items(), key=lambda kv: -kv[1][2])[:10]
    for (file, line, func), (_, _, own, cum, _) in rows:
        print(f"  {own / total:5.1%} / {cum / total:5.1%}  {func} ({Path(file).name}:{line})")


def run(repeats: int = 5, zh_corpus: "str | None" = None) -> dict:
    """Tokens/s of ours and of the HF baseline per repeat, and their ratio (ours / baseline) per repeat; the
    ``zh_*`` keys for the Chinese case when its corpus is there (``zh_skipped`` says why not otherwise)."""
    _pin_one_core()
    import torch
    from albert_dist.data.config import DataConfig
    from albert_dist.data.sources.discover import resolve_path
    from albert_dist.data.stream import iter_texts

    torch.set_num_threads(1)
    cfg = DataConfig(max_seq_length=SEQ, num_workers=0)
    texts = list(iter_texts(cfg.train, "data.train", cfg.max_document_bytes))
    tokenizer, collator = _hf_peer(str(resolve_path(cfg.tokenizer_path).parent))
    from albert_dist.data.tokenizer import load_tokenizer

    sp = load_tokenizer(cfg.tokenizer_path)
    ours, base, ours_wall, base_wall, sp_only = [], [], [], [], []
    for _ in range(repeats):
        n, cpu = _sentencepiece_only(sp, texts)
        sp_only.append(n / cpu)
        n, cpu, wall = _baseline(tokenizer, collator, texts)
        base.append(n / cpu)
        base_wall.append(n / wall)
        n, cpu, wall = _ours(cfg, num_tokens=n)
        ours.append(n / cpu)
        ours_wall.append(n / wall)
    ratio = [o / b for o, b in zip(ours, base)]
    corpora = [Path(zh_corpus)] if zh_corpus else [p for p in ZH_CORPORA if p.is_file()]
    zh = (_chinese(repeats, corpora[0]) if corpora and corpora[0].is_file()
          else {"zh_skipped": f"no zhwiki corpus at {[str(p) for p in corpora or ZH_CORPORA]}"})
    return {**zh, "ours_tokens_per_s": ours, "baseline_tokens_per_s": base, "ratio": ratio,
            "sentencepiece_only_tokens_per_s": sp_only, "ours_tokens_per_wall_s": ours_wall, "baseline_tokens_per_wall_s": base_wall, "seq_len": SEQ,
            "batch_size": BATCH, "target_ratio": 2.0, "target_ours_tokens_per_s": 1e6}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--zh-corpus", default=None, help="zhwiki .jsonl for the Chinese case (default: see above)")
    parser.add_argument("--profile-zh", action="store_true", help="profile the Chinese case instead (cProfile)")
    args = parser.parse_args()
    if args.profile_zh:
        corpora = [Path(args.zh_corpus)] if args.zh_corpus else [p for p in ZH_CORPORA if p.is_file()]
        profile_chinese(corpora[0])
        return
    res = run(args.repeats, args.zh_corpus)
    print(f"data pipeline, one core, seq {SEQ}, batch {BATCH}, {args.repeats} repeats (min / median / max)")
    print(f"  ours (stream+sentences+SOP+n-gram masking): {fmt_stats(res['ours_tokens_per_s'], 1e6)} M tokens/CPU-s")
    print(f"  HF AlbertTokenizer+group_texts+DataCollatorForLanguageModeling: {fmt_stats(res['baseline_tokens_per_s'], 1e6)} M tokens/CPU-s")
    print(f"  ratio ours / HF: {fmt_stats(res['ratio'])}  (target >= 2.0; ours target >= 1.0 M tokens/s)")
    print(f"  (sentencepiece encoding alone: {fmt_stats(res['sentencepiece_only_tokens_per_s'], 1e6)} M tokens/CPU-s)")
    print(f"  wall clock: ours {fmt_stats(res['ours_tokens_per_wall_s'], 1e6)}, HF {fmt_stats(res['baseline_tokens_per_wall_s'], 1e6)} M tokens/s")
    if "zh_skipped" in res:
        print(f"Chinese case skipped: {res['zh_skipped']}")
        return
    print(f"Chinese (zhwiki, {res['zh_documents']} documents, {res['zh_characters']:,} characters, data/zhwiki/spiece.model):")
    print(f"  ours, jieba words:       {fmt_stats(res['zh_ours_words_tokens_per_s'], 1e6)} M tokens/CPU-s")
    print(f"  ours, character units:   {fmt_stats(res['zh_ours_chars_tokens_per_s'], 1e6)} M tokens/CPU-s")
    print(f"  HF peer:                 {fmt_stats(res['zh_baseline_tokens_per_s'], 1e6)} M tokens/CPU-s")
    print(f"  words / characters (the cost of segmentation): {fmt_stats(res['zh_words_over_chars'])}")
    print(f"  ratio ours (words) / HF: {fmt_stats(res['zh_ratio_words'])}  (target >= 2.0); "
          f"ours (characters) / HF: {fmt_stats(res['zh_ratio_chars'])}")


if __name__ == "__main__":
    main()
