"""Loaders: exact resume (0 workers here, 2: tests/integration/test_loader_workers.py; twice, no replay), state
serialisation, config."""
from __future__ import annotations

import io
import json

import pytest
import torch
from omegaconf import OmegaConf

from albert_dist.data import stream as stream_mod
from albert_dist.data.config import DataConfig, SourceConfig
from albert_dist.data.loader import build_train_loader, prefetch_factor_for
from fixtures.loader_checks import assert_same as _assert_same
from fixtures.loader_checks import check_exact_resume_across_shuffle_windows, check_exact_resume_twice_in_a_row
from fixtures.loader_checks import data_cfg as _cfg
from fixtures.loader_checks import take as _take


def test_exact_resume_twice_in_a_row():
    """0 workers; 2 worker processes: tests/integration/test_loader_workers.py."""
    check_exact_resume_twice_in_a_row(0)


def test_the_prefetch_depth_covers_a_step_of_micro_batches():
    """num_workers x prefetch_factor >= GA, the least such factor, never below torch's default 2; none without
    workers; the loader gets it, and page-locked memory only when asked (the trainer asks on CUDA)."""
    assert prefetch_factor_for(0, 16) is None
    for workers, ga, factor in [(1, 1, 2), (2, 1, 2), (2, 4, 2), (2, 5, 3), (2, 16, 8), (3, 16, 6), (2, 64, 32)]:
        assert prefetch_factor_for(workers, ga) == factor, (workers, ga)
    loader = build_train_loader(_cfg(2), 4, rank=0, world_size=1, micro_batches_per_step=16)
    assert loader.num_workers * loader.prefetch_factor == 16 and loader.pin_memory is False
    assert build_train_loader(_cfg(0), 4, rank=0, world_size=1, micro_batches_per_step=16, pin_memory=True).pin_memory
    with pytest.raises(ValueError, match="micro_batches_per_step"):
        build_train_loader(_cfg(2), 4, rank=0, world_size=1, micro_batches_per_step=0)


@pytest.mark.parametrize("window", [1, 3])
def test_resume_reads_only_the_current_window(monkeypatch, window):
    """Resume cost is bounded by the pieces of the current shuffle window (``shuffle_documents`` documents),
    not by the position in the stream (no replay from the start)."""
    cfg = _cfg(0, shuffle_documents=window)
    loader = build_train_loader(cfg, 8, rank=0, world_size=1)
    it = iter(loader)
    _take(it, 60 * window)  # well into the epoch (several pieces consumed)
    state = loader.state_dict()
    src_state = state["dataset_state"]["before"]["sources"][0]
    assert src_state["datasets"]["examples_iterable"]["shard_idx"] >= 2
    expected = _take(it, 2)

    records_read = []
    real = stream_mod.read_piece

    def counting(piece, *args, **kwargs):
        for rec in real(piece, *args, **kwargs):
            records_read.append(piece["start"])
            yield rec

    monkeypatch.setattr(stream_mod, "read_piece", counting)
    resumed = build_train_loader(cfg, 8, rank=0, world_size=1)
    resumed.load_state_dict(state)
    _assert_same(_take(iter(resumed), 2), expected)
    # the window's pieces (and perhaps the next one), nothing before them
    assert len(set(records_read)) <= window + 1
    assert len(records_read) < src_state["records_in_epoch"]


def test_exact_resume_across_shuffle_windows():
    """0 workers; 2 worker processes: tests/integration/test_loader_workers.py."""
    check_exact_resume_across_shuffle_windows(0)


def test_batches_mix_documents(monkeypatch):
    """With the default window a micro batch of 16 holds examples of many documents; with a window of 1 it is
    consecutive examples of one article (the behaviour that slowed learning, docs/convergence.md)."""
    from albert_dist.data import loader as loader_mod

    doc_of: dict[int, int] = {}
    real_build = loader_mod.ExampleBuilder.build_documents
    real_collate = loader_mod.collate
    batches_docs: list[set[int]] = []

    def build(self, texts, rngs):
        per_doc = real_build(self, texts, rngs)
        for text, examples in zip(texts, per_doc):
            for e in examples:
                doc_of[id(e)] = hash(text)
        return per_doc

    def collate(examples, max_seq_length):
        batches_docs.append({doc_of[id(e)] for e in examples})
        return real_collate(examples, max_seq_length)

    monkeypatch.setattr(loader_mod.ExampleBuilder, "build_documents", build)
    monkeypatch.setattr(loader_mod, "collate", collate)
    distinct = {}
    for window in (1, DataConfig().shuffle_documents):
        batches_docs.clear()
        cfg = DataConfig(max_seq_length=128, num_workers=0, shuffle_documents=window)
        _take(iter(build_train_loader(cfg, 16, rank=0, world_size=1)), 4)
        distinct[window] = min(len(d) for d in batches_docs)
    assert distinct[1] <= 2  # one article per batch (two where it ends)
    assert distinct[DataConfig().shuffle_documents] >= 8, distinct


def test_resume_with_another_layout_is_refused():
    cfg = _cfg(0)
    loader = build_train_loader(cfg, 4, rank=0, world_size=2)
    it = iter(loader)
    _take(it, 2)
    state = loader.state_dict()
    other = build_train_loader(cfg, 4, rank=0, world_size=1)
    other.load_state_dict(state)
    with pytest.raises(ValueError, match="same world size and num_workers"):
        next(iter(other))
    other_batch = build_train_loader(cfg, 8, rank=0, world_size=2)
    other_batch.load_state_dict(state)  # StatefulDataLoader hands the state to the dataset when iterating
    with pytest.raises(ValueError, match="fingerprint"):
        next(iter(other_batch))


def test_default_config_streams_the_bundled_sample():
    cfg = DataConfig(num_workers=0, max_seq_length=128)
    batch = next(iter(build_train_loader(cfg, 3, 0, 1)))
    for key in ("input_ids", "attention_mask", "token_type_ids", "mlm_labels"):
        assert batch[key].shape == (3, 128) and batch[key].dtype == torch.int64
    assert batch["sop_labels"].shape == (3,) and batch["sop_labels"].dtype == torch.int64
    assert (batch["attention_mask"].sum(1) > 8).all()


def test_config_is_a_structured_config_and_validates():
    base = OmegaConf.structured(DataConfig)
    merged = OmegaConf.merge(base, OmegaConf.create({"max_seq_length": 128, "train": [{"paths": ["x/*.jsonl"], "weight": 2.0}]}))
    cfg = OmegaConf.to_object(merged)
    assert isinstance(cfg, DataConfig) and isinstance(cfg.train[0], SourceConfig) and cfg.train[0].weight == 2.0
    with pytest.raises(Exception):
        OmegaConf.merge(base, OmegaConf.create({"max_seq_lenght": 128}))  # typo: strict
    for field, value in [("max_seq_length", 4), ("masked_lm_prob", 1.5), ("short_seq_prob", -0.1),
                         ("max_ngram", 0), ("num_workers", -1), ("eval_examples", 0), ("train", [])]:
        with pytest.raises(ValueError, match=f"data.{field}"):
            DataConfig(**{field: value})
    with pytest.raises(ValueError, match="weight must be > 0"):
        SourceConfig(paths=["a.txt"], weight=0.0)
    with pytest.raises(ValueError, match="paths must list"):
        SourceConfig(paths=[])


@pytest.mark.timeout(60)
def test_a_corpus_without_examples_fails_instead_of_hanging(tmp_path):
    (tmp_path / "tiny.txt").write_text("\n\n".join(["a"] * 20) + "\n")  # one-piece documents: no A/B pair
    cfg = DataConfig(train=[SourceConfig(paths=[str(tmp_path / "tiny.txt")])], num_workers=0, max_seq_length=16)
    with pytest.raises(ValueError, match="without one example"):
        next(iter(build_train_loader(cfg, 2, 0, 1)))
