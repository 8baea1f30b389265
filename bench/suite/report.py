"""Render a benchmark suite's ``results.json`` as the results table of docs/benchmarks.md and a PNG plot.

Used by ``bench/run_all.py`` after a suite run, and on its own to re-render from an existing file:

    python bench/suite/report.py [--results bench/results/results.json] [--doc docs/benchmarks.md] [--plot bench/results/results.png]

Which figures make the table is declared once, in :data:`HEADLINES`: every row names the benchmark, the
dotted key of its ratio in that benchmark's result, the target from the issue that asked for it, and (when
the ratio compares two measured throughputs or times) the keys of "ours" and of "the peer". A benchmark the
table does not know yet still appears: every numeric key whose name contains ``ratio`` becomes a row.

A summary is what ``run_all.summarize`` makes of a measured value: ``{"min", "median", "max", "n"}`` over the
repeats (n = 1 for a scalar). This module only reads results; it never runs a benchmark.
"""
from __future__ import annotations

import argparse
import json
import math
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional

TABLE_START = "<!-- bench table start -->"
TABLE_END = "<!-- bench table end -->"
SECTION_TITLE = "Benchmarks"
"""The table lives in the section with this heading (any level: ``# Benchmarks`` in docs/benchmarks.md)."""


@dataclass(frozen=True)
class Headline:
    """One row of the results table: a ratio of ours against a peer measured in the same run."""

    bench: str
    """Benchmark module name (file name in bench/ without .py)."""
    label: str
    """What the row measures, in words."""
    ratio_key: str
    """Dotted key of the ratio in the benchmark's result (a per-repeat list or a scalar)."""
    target_op: Optional[str] = None
    """'>=' or '<=' (the ratio must be at least / at most target), None when the issue sets no target."""
    target: Optional[float] = None
    """The target value of the ratio, from the issue that asked for the benchmark."""
    ours_key: Optional[str] = None
    """Dotted key of our measured value (plotted against the peer's), None for a ratio of two of ours."""
    peer_key: Optional[str] = None
    """Dotted key of the peer's measured value, same unit as ours_key."""
    unit: str = ""
    """Unit of ours_key / peer_key (e.g. 'tokens/s', 's')."""

    def met(self, value: float) -> Optional[bool]:
        """True/False whether ``value`` meets the target; None without a target or for a non-finite value."""
        if self.target_op is None or self.target is None or not math.isfinite(value):
            return None
        return value >= self.target if self.target_op == ">=" else value <= self.target


#: The suite's headline rows, targets as written in issues 2 (model), 3 (data), 4 (engine), 7 (LAMB), 8, 11, 19
#: (data at scale) and 20 (memory).
#: Keys follow what each benchmark's ``run()`` returns; a row whose ratio key is missing is shown as "n/a".
HEADLINES: tuple[Headline, ...] = (
    Headline("model_step", "train step ALBERT-base B=8 S=128 fp32, 1 thread: ours / transformers (SDPA)",
             "ratio_ours_over_hf", ">=", 1.15, "ours_tokens_per_s", "hf_tokens_per_s", "tokens/CPU-s"),
    Headline("model_step", "ours: model FLOP/s / fp32 matmul peak measured in the same run (MFU)",
             "ours_mfu"),
    Headline("data_pipeline", "data pipeline S=512, 1 core: ours / HF tokenizer + run_mlm grouping + collator",
             "ratio", ">=", 2.0, "ours_tokens_per_s", "baseline_tokens_per_s", "tokens/CPU-s"),
    Headline("data_pipeline", "data pipeline: ours, tokens per CPU-second (absolute figure, not a ratio)",
             "ours_tokens_per_s", ">=", 1e6),
    Headline("data_pipeline", "data pipeline zhwiki S=512, 1 core, jieba words (issue 27): ours / HF peer",
             "zh_ratio_words", ">=", 2.0, "zh_ours_words_tokens_per_s", "zh_baseline_tokens_per_s", "tokens/CPU-s"),
    Headline("data_pipeline", "data pipeline zhwiki: ours with jieba words / ours with character units",
             "zh_words_over_chars", None, None, "zh_ours_words_tokens_per_s", "zh_ours_chars_tokens_per_s",
             "tokens/CPU-s"),
    Headline("zero", "ZeRO-3 all-gather bytes per step / unique parameter bytes (12 layers, 1 shared group)",
             "ratio_allgather_over_param_bytes", "<=", 2.0),
    Headline("zero", "ZeRO-1 optimizer-state bytes per rank, 2 ranks / 1 rank",
             "ratio_optim_state_zero1", "<=", 0.55),
    Headline("zero", "ZeRO-2 optimizer-state bytes per rank, 2 ranks / 1 rank",
             "ratio_optim_state_zero2", "<=", 0.55),
    Headline("zero", "step time ZeRO-1 / ZeRO-0, 2 ranks", "ratio_step_zero1_over_zero0", None, None,
             "step_s.zero1", "step_s.zero0", "s"),
    Headline("zero", "step time ZeRO-2 / ZeRO-0, 2 ranks", "ratio_step_zero2_over_zero0", None, None,
             "step_s.zero2", "step_s.zero0", "s"),
    Headline("zero", "step time ZeRO-3 / ZeRO-0, 2 ranks", "ratio_step_zero3_over_zero0", None, None,
             "step_s.zero3", "step_s.zero0", "s"),
    Headline("lamb", "train step LAMB / AdamW, ZeRO-2, 2 ranks, CPU seconds per step (mean over ranks)",
             "ratio_lamb_over_adamw", "<=", 1.15, "lamb_step_s", "adamw_step_s", "CPU s"),
    Headline("lamb", "train step LAMB / AdamW, ZeRO-2, 2 ranks, wall seconds per step",
             "wall_ratio_lamb_over_adamw", "<=", 1.15, "lamb_wall_step_s", "adamw_wall_step_s", "s"),
    Headline("checkpoint_io", "checkpoint save ALBERT-base: DeepSpeed engine / torch.save",
             "albert-base.ratio_save", None, None,
             "albert-base.deepspeed_save_s", "albert-base.torch_save_s", "s"),
    Headline("checkpoint_io", "checkpoint load ALBERT-base: DeepSpeed engine / torch.load",
             "albert-base.ratio_load", None, None,
             "albert-base.deepspeed_load_s", "albert-base.torch_load_s", "s"),
    Headline("convergence", "val MLM accuracy after 60 steps (suite length, near the floor; 1,000 steps in "
             "docs/convergence-peer.md): ours (matched) / transformers run_mlm peer",
             "matched.step_60.ratio_accuracy_over_peer", None, None,
             "matched.step_60.mlm_accuracy", "peer.step_60.mlm_accuracy", "accuracy"),
    Headline("hf_trainer", "whole loop, albert-tiny, 2 CPU ranks, global batch 32 x 128, samples/s over steps 21-120: "
             "ours / transformers' Trainer (DDP, gloo)", "ratio_samples_per_s_ours_over_peer", None, None,
             "ours_samples_per_s", "peer_samples_per_s", "samples/s"),
    Headline("hf_trainer", "time to the same val MLM accuracy (the lower final of the two): transformers' Trainer / "
             "ours", "ratio_time_to_accuracy_peer_over_ours"),
    Headline("compile_step", "train step albert-tiny B=16 S=128 fp32, 1 thread: eager / compiled block scope "
             "(speedup)", "speedup_block", None, None, "step_cpu_s.block", "step_cpu_s.eager_static", "CPU s"),
    Headline("compile_step", "train step: eager / compiled model scope (engine.compile(); speedup)",
             "speedup_model", None, None, "step_cpu_s.model", "step_cpu_s.eager_static", "CPU s"),
    Headline("compile_step", "train step: dynamic MLM gather / static (speedup of the static gather)",
             "static_over_dynamic", None, None, "step_cpu_s.eager_static", "step_cpu_s.eager_dynamic", "CPU s"),
    Headline("compile_step", "compile time, block scope, cold caches, CPU s (figure)", "compile_block_cpu_s"),
    Headline("compile_step", "compile time, model scope, cold caches, CPU s (figure)", "compile_model_cpu_s"),
    Headline("data_scale", "read amplification of uncompressed .jsonl (many small / few large files), worst of 1, 8, "
             "64, 512 slots", "amplification.max_uncompressed_jsonl", "<=", 1.1),
    Headline("data_scale", "read amplification after `data prepare` (.jsonl.zst, parquet), worst of 1-512 slots",
             "amplification.max_after_prepare", "<=", 1.1),
    Headline("data_scale", "one slot's tokens per CPU-second: large corpus / small corpus",
             "throughput.ratio_large_over_small", ">=", 0.9, "throughput.tokens_per_cpu_s_large",
             "throughput.tokens_per_cpu_s_small", "tokens/CPU-s"),
    Headline("data_scale", "1-step train over 2,000 .jsonl files, wall seconds (target from issue 19)",
             "startup.many_files.wall_s", "<=", 30.0),
    Headline("data_scale", "1-step train CPU seconds: 2,000 files / the bundled 8 (same text size)",
             "startup.ratio_cpu_many_over_sample", None, None, "startup.many_files.cpu_s",
             "startup.bundled_sample.cpu_s", "CPU s"),
    Headline("data_scale", "tokenizer train peak RSS, vocab 8000, 100 MB: byte-budgeted sample / every document into "
             "sentencepiece's 2M-sentence reservoir (the previous command)", "tokenizer.100MB.ratio_rss_ours_over_peer",
             None, None, "tokenizer.100MB.ours.peak_rss_bytes",
             "tokenizer.100MB.peer_reservoir_2m_sentences.peak_rss_bytes", "bytes"),
    Headline("data_scale", "tokenizer train peak RSS at 100 MB (1 GB and 10 GB with --full --10g), bytes",
             "tokenizer.100MB.ours.peak_rss_bytes", "<=", 2e9),
    Headline("data_scale", "data prepare of .jsonl.zst, MB per CPU-second: ours (1 worker, dedup, sized row groups) / "
             "datasets load_dataset('json').to_parquet()", "prepare.ratio_mb_per_cpu_s_ours_over_peer", None, None,
             "prepare.workers_1.mb_per_cpu_s", "prepare.peer_datasets_json_to_parquet.mb_per_cpu_s", "MB/CPU-s"),
    Headline("data_scale", "the same, ours reading the corpus from an S3 server (moto) / the peer reading the local "
             "files", "prepare.ratio_mb_per_cpu_s_ours_from_s3_over_peer", None, None, "prepare.from_s3.mb_per_cpu_s",
             "prepare.peer_datasets_json_to_parquet.mb_per_cpu_s", "MB/CPU-s"),
    Headline("memory_scale", "model states per rank of albert-base (ZeRO-2/3, 1 and 4 ranks, bf16): DeepSpeed's "
             "tensors / our estimate (albert_dist.engine.memory), lowest cell", "headline.states_vs_ours_min", ">=", 0.8),
    Headline("memory_scale", "the same, highest cell", "headline.states_vs_ours_max", "<=", 1.25),
    Headline("memory_scale", "the same cells: DeepSpeed's tensors / DeepSpeed's estimators, lowest cell",
             "headline.states_vs_deepspeed_bf16_min", ">=", 0.8),
    Headline("memory_scale", "the same, highest cell", "headline.states_vs_deepspeed_bf16_max", "<=", 1.25),
    Headline("memory_scale", "ZeRO-3 model states per rank, 4 ranks / 1 rank", "headline.zero3_states_4_over_1_ranks_max",
             "<=", 0.3),
    Headline("memory_scale", "activations of albert-base S=512 (torch's profiler) / our formula, lowest of saved and "
             "peak, with and without checkpointing", "headline.activations_vs_ours_min", ">=", 0.8),
    Headline("memory_scale", "the same, highest", "headline.activations_vs_ours_max", "<=", 1.25),
    Headline("data_wait", "step time at GA 16, 32 x S=512 per step, 2 workers: loader depth 4 (torch's default) / "
             "a step's 16 (issue 34)", "ratio_step_old_over_step_depth_ga16", None, None, "ga16_old_depth.step_s",
             "ga16_step_depth.step_s", "s"),
    Headline("data_wait", "step time GA 16 / GA 1 at equal global batch, loader depth = GA",
             "ratio_step_ga16_over_ga1_step_depth", None, None, "ga16_step_depth.step_s", "ga1.step_s", "s"),
    Headline("data_wait", "data-wait share of the step at GA 16, loader depth = GA (figure; GA 1's in results.json)",
             "ga16_step_depth.share"),
    Headline("attention_mask", "SDPA fwd+bwd on CPU, B=4 S=512 fp32: all-ones bool mask / no mask (issue 34)",
             "s512_fp32.ratio_train_masked_over_unmasked", None, None, "s512_fp32.train_masked_s",
             "s512_fp32.train_unmasked_s", "CPU s"),
    Headline("attention_mask", "SDPA fwd+bwd on CPU, B=16 S=128 fp32: all-ones bool mask / no mask",
             "s128_fp32.ratio_train_masked_over_unmasked", None, None, "s128_fp32.train_masked_s",
             "s128_fp32.train_unmasked_s", "CPU s"),
    Headline("resume", "loader restore + first batch, 0 workers: far (after 300 batches, as ours) / near (after 1)",
             "workers_0.ratio_far_over_near", "<=", 1.2, "workers_0.far_resume_s", "workers_0.near_resume_s", "s"),
    Headline("resume", "loader restore + first batch, 2 workers: far (after 300 batches, as ours) / near (after 1)",
             "workers_2.ratio_far_over_near", "<=", 1.2, "workers_2.far_resume_s", "workers_2.near_resume_s", "s"),
)


def _lookup(summary: dict[str, Any], key: str) -> Optional[dict[str, float]]:
    """The ``{"min", "median", "max", "n"}`` summary of ``key`` in a benchmark's summaries, or None."""
    value = summary.get(key)
    return value if isinstance(value, dict) and "median" in value else None


def _fmt(x: float) -> str:
    """A number for the table: thousands separators from 1e4, 4 significant digits from 1 (so that a ratio of
    1.146 is not shown as a target-meeting 1.15), 3 below."""
    if not math.isfinite(x):
        return str(x)
    if abs(x) >= 1e4:
        return f"{x:,.0f}"
    return f"{x:.4g}" if abs(x) >= 1 else f"{x:.3g}"


def _fmt_stat(stat: Optional[dict[str, float]], unit: str = "") -> str:
    """``median (min–max)`` of a summary, or 'n/a'; the range is left out for a single measurement."""
    if stat is None:
        return "n/a"
    text = _fmt(stat["median"])
    if stat["min"] != stat["max"]:
        text += f" ({_fmt(stat['min'])}–{_fmt(stat['max'])})"
    return f"{text} {unit}".rstrip()


def rows(results: dict[str, Any]) -> list[dict[str, Any]]:
    """The table's rows for a results dict as written by run_all (keys ``benchmarks``, ``machine``).

    Each row: ``bench, label, ratio (summary or None), ours, peer (summaries or None), unit, target (text),
    met (True/False/None), status`` ('ok', 'skipped', 'failed', 'timed out', 'not run').
    """
    benches: dict[str, Any] = results.get("benchmarks", {})
    out: list[dict[str, Any]] = []
    known = {h.bench for h in HEADLINES}
    for h in HEADLINES:
        entry = benches.get(h.bench)
        status = entry["status"] if entry else "not run"
        summary = entry.get("summary", {}) if entry else {}
        ratio = _lookup(summary, h.ratio_key)
        out.append({
            "bench": h.bench, "label": h.label, "ratio": ratio, "unit": h.unit,
            "ours": _lookup(summary, h.ours_key) if h.ours_key else None,
            "peer": _lookup(summary, h.peer_key) if h.peer_key else None,
            "target": f"{h.target_op} {_fmt(h.target)}" if h.target_op else "—",
            "met": h.met(ratio["median"]) if ratio else None,
            "status": status if (ratio or status != "ok") else "key missing",
        })
    # Benchmarks HEADLINES does not name yet: every ratio they report, without a target.
    for name in sorted(set(benches) - known):
        entry = benches[name]
        ratio_keys = [k for k in entry.get("summary", {}) if re.search(r"ratio", k.split(".")[-1])]
        if not ratio_keys:
            out.append({"bench": name, "label": "(no ratio reported)", "ratio": None, "unit": "", "ours": None,
                        "peer": None, "target": "—", "met": None, "status": entry["status"]})
        for key in ratio_keys:
            out.append({"bench": name, "label": key, "ratio": entry["summary"][key], "unit": "", "ours": None,
                        "peer": None, "target": "—", "met": None, "status": entry["status"]})
    return out


def render_table(results: dict[str, Any]) -> str:
    """The results table (Markdown) with the machine line above it, from a results dict."""
    m = results.get("machine", {})
    versions = ", ".join(f"{k} {v}" for k, v in m.get("versions", {}).items() if v)
    head = (
        f"Measured {m.get('date_utc', '?')} on {m.get('cpu_model', '?')}, {m.get('cpu_cores_used', '?')} of "
        f"{m.get('cpu_count', '?')} cores, {_fmt(m.get('memory_gib', float('nan')))} GiB RAM"
        f"{', GPU ' + m['gpu'] if m.get('gpu') else ', no GPU'}; {versions}; suite wall time "
        f"{_fmt(results.get('wall_s', float('nan')))} s, commit {m.get('git_commit', '?')}. "
        "Figures: median (min–max) over the repeats of one run; ratios are computed per repeat."
    )
    lines = [head, "", "| benchmark | measure | ours | peer | ratio ours / peer (or figure) | target | met |",
             "|---|---|---|---|---|---|---|"]
    for r in rows(results):
        met = {True: "yes", False: "**no**", None: "—"}[r["met"]]
        ratio = _fmt_stat(r["ratio"]) if r["ratio"] else f"n/a ({r['status']})"
        lines.append(f"| {r['bench']} | {r['label']} | {_fmt_stat(r['ours'], r['unit']) if r['ours'] else '—'} | "
                     f"{_fmt_stat(r['peer'], r['unit']) if r['peer'] else '—'} | {ratio} | {r['target']} | {met} |")
    notes = notes_of(results)
    if notes:
        lines += [""] + [f"- {n}" for n in notes]
    return "\n".join(lines)


def notes_of(results: dict[str, Any]) -> list[str]:
    """Notes for the table: each benchmark's ``result["notes"]`` and why a benchmark did not finish."""
    out = []
    for name, entry in results.get("benchmarks", {}).items():
        result = entry.get("result") or {}
        out += [f"{name}: {n}" for n in result.get("notes", []) if isinstance(n, str)]
        if entry.get("status") == "skipped":
            out.append(f"{name}: skipped: {result.get('skipped')}")
        elif entry.get("status") in ("failed", "timed out", "not run"):
            lines = [line for line in (entry.get("error") or "").splitlines() if line.strip()]
            why = "; ".join(dict.fromkeys(lines[:1] + lines[-1:]))  # first and last line, once each
            out.append(f"{name}: {entry['status']} ({why})")
    return out


def update_readme(readme_text: str, table: str) -> str:
    """``readme_text`` with ``table`` placed between the table markers inside the ``Benchmarks`` section.

    The section starts at a heading ``Benchmarks`` of any level (``# Benchmarks`` in docs/benchmarks.md) and
    ends at the next heading of the same or a higher level. The markers are created at the end of the section
    when they are missing.

    Raises:
        ValueError: the text has no ``Benchmarks`` heading, or the markers lie outside that section.
    """
    headings = _headings(readme_text)
    head = next(((pos, level) for pos, level, title in headings if title == SECTION_TITLE), None)
    if head is None:
        raise ValueError(f"no {SECTION_TITLE!r} section (a Markdown heading) to put the results table in")
    start_sec, level = head
    end_sec = next((pos - 1 for pos, lv, _ in headings if pos > start_sec and lv <= level), len(readme_text))
    section = readme_text[start_sec:end_sec]
    block = f"{TABLE_START}\n{table}\n{TABLE_END}"
    if TABLE_START in section and TABLE_END in section:
        a, b = section.index(TABLE_START), section.index(TABLE_END) + len(TABLE_END)
        if b < a:
            raise ValueError(f"{TABLE_END!r} comes before {TABLE_START!r} in the {SECTION_TITLE!r} section")
        section = section[:a] + block + section[b:]
    elif TABLE_START in readme_text or TABLE_END in readme_text:
        raise ValueError(f"the bench table markers exist outside the {SECTION_TITLE!r} section")
    else:
        section = section.rstrip("\n") + "\n\n" + block + "\n"
    if end_sec < len(readme_text) and not section.endswith("\n\n"):
        section = section.rstrip("\n") + "\n\n"
    return readme_text[:start_sec] + section + readme_text[end_sec:]


def _headings(text: str) -> list[tuple[int, int, str]]:
    """(character offset, level, title) of every Markdown heading, skipping fenced code (a ``# comment`` there)."""
    out, offset, fenced = [], 0, False
    for line in text.split("\n"):
        if line.startswith("```"):
            fenced = not fenced
        m = None if fenced else re.match(r"(#+) (.*)$", line)
        if m:
            out.append((offset, len(m.group(1)), m.group(2).strip()))
        offset += len(line) + 1
    return out


def plot(results: dict[str, Any], path: str | Path) -> int:
    """Write a PNG of ours vs the peer (median bars, min–max whiskers) per headline comparison.

    One panel per :data:`HEADLINES` row that has both an ours and a peer figure; panels keep their own unit
    (throughputs: higher is better; times: lower is better). Returns the number of panels drawn (0: no file).
    """
    import matplotlib

    matplotlib.use("Agg")  # headless: the suite runs on servers and in CI
    import matplotlib.pyplot as plt

    pairs = [r for r in rows(results) if r["ours"] and r["peer"]]
    if not pairs:
        return 0
    ncols = min(3, len(pairs))
    nrows = math.ceil(len(pairs) / ncols)
    fig, axes = plt.subplots(nrows, ncols, figsize=(4.2 * ncols, 3.4 * nrows), squeeze=False)
    for ax, r in zip(axes.flat, pairs):
        meds = [r["ours"]["median"], r["peer"]["median"]]
        err = [[m - s["min"] for m, s in zip(meds, (r["ours"], r["peer"]))],
               [s["max"] - m for m, s in zip(meds, (r["ours"], r["peer"]))]]
        ax.bar(["ours", "peer"], meds, yerr=err, capsize=6, color=["tab:blue", "tab:gray"])
        # times (s, CPU s) vs throughputs (x/s)
        better = "lower is better" if r["unit"] in ("s", "CPU s") else "higher is better"
        ratio = r["ratio"]["median"] if r["ratio"] else float("nan")
        ax.set_title(f"{r['bench']}: ratio {_fmt(ratio)} (target {r['target']})", fontsize=9)
        ax.set_ylabel(f"{r['unit']} ({better})", fontsize=8)
        ax.set_xlabel("\n".join(_wrap(r["label"], 48)), fontsize=7)
    for ax in list(axes.flat)[len(pairs):]:
        ax.axis("off")
    m = results.get("machine", {})
    fig.suptitle(f"albert_dist benchmarks vs peers — {m.get('cpu_model', '?')}, "
                 f"{m.get('cpu_cores_used', '?')} cores, {m.get('date_utc', '?')[:10]}", fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return len(pairs)


def _wrap(text: str, width: int) -> list[str]:
    """Greedy word wrap (plot labels only)."""
    lines, cur = [], ""
    for word in text.split():
        if cur and len(cur) + 1 + len(word) > width:
            lines.append(cur)
            cur = word
        else:
            cur = f"{cur} {word}".strip()
    return lines + ([cur] if cur else [])


def main(argv: list[str] | None = None) -> int:
    """Re-render the results table in docs/benchmarks.md and the plot from an existing results file; returns 0."""
    root = Path(__file__).resolve().parents[2]
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--results", default=str(root / "bench" / "results" / "results.json"))
    p.add_argument("--doc", "--readme", dest="doc", default=str(root / "docs" / "benchmarks.md"),
                   help="Markdown file whose 'Benchmarks' section holds the table")
    p.add_argument("--plot", default=str(root / "bench" / "results" / "results.png"))
    args = p.parse_args(argv)
    results = json.loads(Path(args.results).read_text())
    doc = Path(args.doc)
    doc.write_text(update_readme(doc.read_text(), render_table(results)))
    plot(results, args.plot)
    print(render_table(results))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
