"""Resume time of the training loader at a far stream position vs a near one (target ratio <= 1.2).

A resumable stream must seek, not replay: restoring a loader state saved far into the stream must cost about
what restoring one saved near its start costs. The benchmark streams the bundled corpus once with
``albert_dist.data.loader.build_train_loader`` (rank 0 of 1) and keeps ``state_dict()`` and the batch that
followed at ``span`` consecutive near positions (after ``near``, ``near+1``, ... batches) and ``span`` far ones
(after ``far``, ...). Per repeat and position it builds a fresh loader and times ``load_state_dict(state)`` +
the first batch; the ratio is median(far positions) / median(near positions), because resuming re-reads the
document being drained, whose length varies from position to position independently of how far the stream
is. The resumed batch must equal the one the uninterrupted stream produced: mismatches are counted
(``mismatched_resumes``) and reported as a note, since a fast resume to the wrong place is no resume.
Run with 0 and with 2 DataLoader workers (with workers the first batch also pays the worker start-up, the
same at both ends). ``replay_estimate_s`` (``far`` batches at the uninterrupted rate) is what replaying the
stream to the far position would have cost.

    python bench/resume.py [--repeats 3] [--far 300] [--workers 0 2]

``run(repeats=..., ...)`` returns the figures as a dict for bench/run_all.py.
"""
from __future__ import annotations

import argparse
import logging
import os
import statistics
import time
from typing import Any

import torch

log = logging.getLogger("bench.resume")


def _same(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> bool:
    return a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def _resume_once(cfg, micro_batch_size: int, state: dict) -> tuple[float, float, dict[str, torch.Tensor]]:
    """Build a loader, restore ``state``, take one batch: (build seconds, restore + first batch seconds, batch)."""
    from albert_dist.data.loader import build_train_loader

    t0 = time.perf_counter()
    loader = build_train_loader(cfg, micro_batch_size, 0, 1)
    t1 = time.perf_counter()
    loader.load_state_dict(state)
    batch = next(iter(loader))
    t2 = time.perf_counter()
    del loader  # shuts its workers down before the next measurement
    return t1 - t0, t2 - t1, batch


def _bench_workers(num_workers: int, repeats: int, near: int, far: int, span: int, seq: int,
                   micro_batch_size: int) -> dict:
    """Stream once to ``far + span`` batches keeping states and next batches, then time resumes per repeat."""
    from albert_dist.data.config import DataConfig
    from albert_dist.data.loader import build_train_loader

    cfg = DataConfig(max_seq_length=seq, num_workers=num_workers)
    near_pos, far_pos = list(range(near, near + span)), list(range(far, far + span))
    wanted = set(near_pos) | set(far_pos)
    loader = build_train_loader(cfg, micro_batch_size, 0, 1)
    it = iter(loader)
    states: dict[int, dict] = {}
    expected: dict[int, dict[str, torch.Tensor]] = {}
    real_tokens = 0
    t_first = None
    for i in range(far + span):
        if i in wanted:
            states[i] = loader.state_dict()
        batch = next(it)
        if i == 0:
            t_first = time.perf_counter()
        if i in wanted:
            expected[i] = batch
        real_tokens += int(batch["attention_mask"].sum())
    stream_s = time.perf_counter() - t_first  # excludes start-up: the steady rate a replay would run at
    del it, loader

    out: dict[str, Any] = {"near_batches": near_pos, "far_batches": far_pos,
                           "far_tokens": far * micro_batch_size * seq, "non_pad_tokens_streamed": real_tokens,
                           "stream_s_per_batch": stream_s / (far + span - 1),
                           "replay_estimate_s": far * stream_s / (far + span - 1),
                           "near_resume_s": [], "far_resume_s": [], "build_s": [], "ratio_far_over_near": [],
                           "per_position_resume_s": {str(p): [] for p in sorted(wanted)}, "mismatched_resumes": 0}
    for r in range(repeats):
        times: dict[int, float] = {}
        # Alternate near and far so that a warm cache or a noisy neighbour does not favour one side.
        order = [p for pair in zip(near_pos, far_pos) for p in (pair if r % 2 == 0 else pair[::-1])]
        for pos in order:
            build_s, resume_s, batch = _resume_once(cfg, micro_batch_size, states[pos])
            if not _same(batch, expected[pos]):
                out["mismatched_resumes"] += 1
                log.warning("resume after %d batches (%d workers) gave a different batch than the uninterrupted "
                            "stream", pos, num_workers)
            times[pos] = resume_s
            out["build_s"].append(build_s)
            out["per_position_resume_s"][str(pos)].append(resume_s)
        # Medians over positions: the cost of re-reading the document being drained varies with its length,
        # which is not what the target is about (growth with the stream position).
        near_s = statistics.median(times[p] for p in near_pos)
        far_s = statistics.median(times[p] for p in far_pos)
        out["near_resume_s"].append(near_s)
        out["far_resume_s"].append(far_s)
        out["ratio_far_over_near"].append(far_s / near_s)
    return out


def run(repeats: int = 3, near: int = 1, far: int = 300, span: int = 4, seq: int = 128,
        micro_batch_size: int = 8, workers: tuple[int, ...] = (0, 2)) -> dict[str, Any]:
    """Resume figures per worker count: ``{"workers_<n>": {near_resume_s: [..], far_resume_s: [..],
    ratio_far_over_near: [..], stream_s_per_batch, replay_estimate_s, ...}}`` (seconds; lists per repeat).

    Uses the default ``DataConfig`` (the bundled WikiText-2 sample and its sentencepiece model) at sequence
    length ``seq``. ``notes`` lists resumes whose first batch differed from the uninterrupted stream's. Raises
    ``ValueError`` unless 0 <= near < far and repeats >= 1.
    """
    if repeats < 1:
        raise ValueError(f"repeats must be >= 1, got {repeats}")
    if not 0 <= near < near + span <= far:
        raise ValueError(f"need 0 <= near, span >= 1 and near + span <= far, got near={near}, span={span}, far={far}")
    torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", "1")))
    result: dict[str, Any] = {"seq": seq, "micro_batch_size": micro_batch_size, "target_ratio_max": 1.2}
    for n in workers:
        result[f"workers_{n}"] = w = _bench_workers(n, repeats, near, far, span, seq, micro_batch_size)
        if w["mismatched_resumes"]:
            result.setdefault("notes", []).append(
                f"{n} workers: {w['mismatched_resumes']} of {2 * span * repeats} resumes gave a different first batch "
                "than the uninterrupted stream (resume not exact)")
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--near", type=int, default=1)
    parser.add_argument("--span", type=int, default=4, help="consecutive positions measured at each end")
    parser.add_argument("--far", type=int, default=300)
    parser.add_argument("--seq", type=int, default=128)
    parser.add_argument("--micro-batch-size", type=int, default=8)
    parser.add_argument("--workers", type=int, nargs="+", default=[0, 2])
    args = parser.parse_args()
    logging.basicConfig(level=logging.WARNING)
    r = run(repeats=args.repeats, near=args.near, far=args.far, span=args.span, seq=args.seq,
            micro_batch_size=args.micro_batch_size, workers=tuple(args.workers))
    for n in args.workers:
        w = r[f"workers_{n}"]
        med = statistics.median
        print(f"{n} workers, S={args.seq} B={args.micro_batch_size}: resume after "
              f"{args.near}..{args.near + args.span - 1} batches {med(w['near_resume_s']):.3f} s, after "
              f"{args.far}..{args.far + args.span - 1} batches {med(w['far_resume_s']):.3f} s "
              f"(replaying would take ~{w['replay_estimate_s']:.2f} s); ratio far/near median "
              f"{med(w['ratio_far_over_near']):.2f} (min {min(w['ratio_far_over_near']):.2f}, max "
              f"{max(w['ratio_far_over_near']):.2f}; target <= 1.2)")
    for note in r.get("notes", []):
        print("NOTE:", note)


if __name__ == "__main__":
    main()
