"""Data streams continue without repeats or gaps when a checkpoint is resumed on another number of ranks.

Single process: the loaders of "rank r of W" are plain objects, so the old and new layouts are built side by
side and compared batch for batch against the uninterrupted continuation of every old stream.
"""
from __future__ import annotations

import hashlib
from pathlib import Path

import pytest

from albert_dist.data.config import DataConfig, SourceConfig
from albert_dist.data.loader import build_train_loader
from albert_dist.engine.checkpoint.reshard import assign, build_resumed_loader, collect_streams, ReshardedLoader

REPO = Path(__file__).resolve().parents[2]
MICRO = 2


@pytest.fixture(scope="module")
def data_cfg() -> DataConfig:
    return DataConfig(train=[SourceConfig(paths=[str(REPO / "data/sample/wikitext-2-train-*.txt")])],
                      validation=[], tokenizer_path=str(REPO / "data/sample/spiece.model"), max_seq_length=32,
                      max_predictions_per_seq=4, num_workers=0, shard_piece_bytes=65536)


def key(batch) -> str:
    h = hashlib.sha256()
    for name in ("input_ids", "mlm_labels", "sop_labels"):
        h.update(batch[name].numpy().tobytes())
    return h.hexdigest()[:16]


def take(loader, n):
    """The next n batch keys of `loader`'s (single, persistent) iterator: a second iter() would restart it."""
    if not hasattr(loader, "_test_iter"):
        loader._test_iter = iter(loader)
    return [key(next(loader._test_iter)) for _ in range(n)]


def make_factory(cfg):
    return lambda r, w: build_train_loader(cfg, MICRO, r, w)


def test_assignment_rule():
    assert assign(2, 1, 0) == [(0, 1, 0), (1, 1, 0)]
    assert assign(2, 2, 1) == [(1, 1, 0)]
    assert [assign(2, 4, r) for r in range(4)] == [[(0, 2, 0)], [(1, 2, 0)], [(0, 2, 1)], [(1, 2, 1)]]
    assert [assign(2, 3, r) for r in range(3)] == [[(0, 2, 0)], [(1, 1, 0)], [(0, 2, 1)]]
    assert [assign(3, 2, r) for r in range(2)] == [[(0, 1, 0), (2, 1, 0)], [(1, 1, 0)]]
    with pytest.raises(ValueError):
        assign(0, 2, 0)


@pytest.fixture(scope="module")
def two_rank_checkpoint(data_cfg):
    """Two ranks read `done` batches each and save; `future[r]` is stream r's next 8 batches."""
    factory, done = make_factory(data_cfg), 3
    loaders = [factory(r, 2) for r in range(2)]
    seen = [take(l, done) for l in loaders]
    states = [l.state_dict() for l in loaders]
    future = [take(l, 8) for l in loaders]  # the uninterrupted continuation
    assert not set(future[0]) & set(future[1]) and not (set(seen[0]) | set(seen[1])) & (set(future[0]) | set(future[1]))
    return states, seen, future


def test_same_world_size_resumes_exactly(data_cfg, two_rank_checkpoint):
    states, _, future = two_rank_checkpoint
    for r in range(2):
        loader = build_resumed_loader(make_factory(data_cfg), states, 2, r)
        assert take(loader, 4) == future[r][:4]


def test_two_to_one_alternates_the_old_streams(data_cfg, two_rank_checkpoint):
    states, _, future = two_rank_checkpoint
    loader = build_resumed_loader(make_factory(data_cfg), states, 1, 0)
    got = take(loader, 6)
    assert got == [future[0][0], future[1][0], future[0][1], future[1][1], future[0][2], future[1][2]]


def test_two_to_four_splits_each_stream(data_cfg, two_rank_checkpoint):
    states, _, future = two_rank_checkpoint
    got = [take(build_resumed_loader(make_factory(data_cfg), states, 4, r), 3) for r in range(4)]
    assert got[0] == future[0][0:6:2] and got[2] == future[0][1:6:2]
    assert got[1] == future[1][0:6:2] and got[3] == future[1][1:6:2]
    flat = [k for g in got for k in g]
    assert len(flat) == len(set(flat)) == 12  # no repeats


def test_resharded_state_resumes_and_remaps_again(data_cfg, two_rank_checkpoint):
    """2 -> 4 for 2 batches each, save; resume on 4 (exact), and on 2 (native layout, continues the streams)."""
    states, _, future = two_rank_checkpoint
    factory = make_factory(data_cfg)
    four = [build_resumed_loader(factory, states, 4, r) for r in range(4)]
    for l in four:
        take(l, 2)
    saved4 = [l.state_dict() for l in four]
    assert all(isinstance(l, ReshardedLoader) for l in four)
    # Each stream advanced by 4 batches (2 sharers x 2); its true position is the last sharer's.
    streams = collect_streams(saved4)
    assert [(s.rank, s.world) for s in streams] == [(0, 2), (1, 2)]
    # Same world size (4): exact continuation of each rank.
    again = [take(build_resumed_loader(factory, saved4, 4, r), 1) for r in range(4)]
    assert again == [[future[0][4]], [future[1][4]], [future[0][5]], [future[1][5]]]
    # Back to 2 ranks: native loaders, each stream from batch 4 on.
    back = [build_resumed_loader(factory, saved4, 2, r) for r in range(2)]
    assert not any(isinstance(l, ReshardedLoader) for l in back)
    assert [take(l, 2) for l in back] == [future[0][4:6], future[1][4:6]]
