"""Piece sizing, slot shares and `albert-dist data plan` (issue 19): the per-slot figures against a brute-force
count over `slot_shares`, the report (pieces, bytes per slot, amplification, manifest documents, the prepare
command) and the loader's one warning. That the plan is what the loader reads: test_data_formats.py."""
from __future__ import annotations

import json
import logging
from pathlib import Path

import numpy as np
import pytest

from albert_dist import cli
from albert_dist.data import loader as loader_mod
from albert_dist.data.config import DataConfig, SourceConfig
from albert_dist.data.sources.discover import (MIN_PIECE_BYTES, PIECES_PER_SLOT, piece_bytes_for, read_amplification,
                                               slot_shares)
from albert_dist.data.sources.pieces import AMPLIFICATION_LIMIT, job_sources, slot_table

REPO = Path(__file__).resolve().parents[2]
RECIPE = str(REPO / "configs/pretrain/albert-tiny-wikitext.yaml")
SPIECE = str(REPO / "data/sample/spiece.model")


def test_piece_size_rule():
    # a few pieces per slot, between the floor and shard_piece_bytes
    assert piece_bytes_for(64 << 30, 4 << 20, 8) == 4 << 20  # large corpus, few slots: the configured cap
    assert piece_bytes_for(4 << 30, 4 << 20, 8192) == -(-(4 << 30) // (PIECES_PER_SLOT * 8192))  # 128 KiB
    assert piece_bytes_for(10 << 20, 4 << 20, 8192) == MIN_PIECE_BYTES  # tiny corpus: the floor
    assert piece_bytes_for(10 << 20, 4096, 8192) == 4096  # a configured size below the floor is kept
    with pytest.raises(ValueError, match="slots must be >= 1"):
        piece_bytes_for(1, 4096, 0)


@pytest.mark.parametrize("pieces,slots", [(1, 1), (7, 3), (3, 7), (5, 5), (2, 9), (40, 8)])
def test_slot_table_and_amplification_match_a_count_over_slot_shares(pieces, slots):
    nbytes = np.random.default_rng(pieces * 100 + slots).integers(1, 1000, size=pieces)
    reads = np.zeros(pieces, dtype=np.int64)  # how many slots read each piece, from slot_shares directly
    keeps: dict[int, list[tuple[int, int]]] = {}
    per_slot, bytes_per_slot = slot_table(nbytes, slots)
    for slot in range(slots):
        shares = slot_shares(pieces, slots, slot)
        assert per_slot[slot] == len(shares)
        assert bytes_per_slot[slot] == sum(nbytes[i] for i, _, _ in shares)
        for i, k, j in shares:
            reads[i] += 1
            keeps.setdefault(i, []).append((k, j))
    for i, shares in keeps.items():  # the sharers of a piece keep disjoint, covering residues
        assert sorted(j for _, j in shares) == list(range(shares[0][0])) and len(shares) == shares[0][0]
    assert set(keeps) == set(range(pieces))
    assert read_amplification(nbytes, slots) == pytest.approx((nbytes * reads).sum() / nbytes.sum())


def _zst_corpus(tmp_path: Path, files: int) -> Path:
    import zstandard

    folder = tmp_path / "pile"
    folder.mkdir()
    for f in range(files):
        rows = "".join(json.dumps({"text": f"document {f}-{i} . with two sentences ."}) + "\n" for i in range(50))
        (folder / f"{f:02d}.jsonl.zst").write_bytes(zstandard.ZstdCompressor().compress(rows.encode()))
    return folder


@pytest.fixture
def tiny_pieces(monkeypatch):
    """Our test corpora are KBs: let them count as big enough for `prepare` (the real floor is 64 KiB a slot)."""
    from albert_dist.data.sources import pieces as plan

    monkeypatch.setattr(plan, "MIN_PIECE_BYTES", 16)


def test_plan_of_a_compressed_corpus_prints_the_figures_and_the_prepare_command(tmp_path, capsys, tiny_pieces):
    folder = _zst_corpus(tmp_path, 3)
    source = f"data.train=[{{paths: ['{folder}/*.jsonl.zst']}}]"
    assert cli.main(["data", "plan", "--config", RECIPE, "--ranks", "2", "--workers", "4", source]) == 0
    out = capsys.readouterr().out
    assert "2 ranks x 4 workers = 8 slots" in out
    assert "3 files" in out and "3 compressed" in out and "pieces: 3 (one per compressed file" in out
    assert "each piece is read whole by 2-3 slots" in out
    (plan,) = job_sources(DataConfig(train=[SourceConfig(paths=[f"{folder}/*.jsonl.zst"])]), ranks=2, workers=4)
    sizes = sorted((p["nbytes"] for p in plan.piece_list), reverse=True)
    assert plan.amplification == pytest.approx((3 * sizes[0] + 3 * sizes[1] + 2 * sizes[2]) / sum(sizes))
    assert plan.amplification > AMPLIFICATION_LIMIT and f"read amplification: {plan.amplification:.2f}" in out
    command = (f"albert-dist data prepare --input '{folder}/*.jsonl.zst' --output {folder}-prepared "
               f"--target-ranks 2 --target-loader-workers 4  # then train with "
               f"data.train=[{{paths: ['{folder}-prepared/*.parquet']}}]")
    assert command in out
    # --json: the same plan, machine-readable
    assert cli.main(["data", "plan", "--config", RECIPE, "--ranks", "2", "--workers", "4", "--json", source]) == 0
    got = json.loads(capsys.readouterr().out)["sources"][0]
    assert got["pieces"] == 3 and got["prepare_command"] == command and got["slots"] == 8


def test_plan_reads_documents_per_epoch_from_a_manifest(tmp_path, capsys):
    folder = _zst_corpus(tmp_path, 2)
    manifest = {"documents": 100, "bytes": 1234, "tokens_estimate": 2000,
                "files": [{"path": "00.jsonl.zst", "documents": 50}, {"path": "01.jsonl.zst", "documents": 50}]}
    (folder / "manifest.json").write_text(json.dumps(manifest))
    # the directory as the source: manifest.json beside the shards is not read as a corpus file
    assert cli.main(["data", "plan", "--config", RECIPE, "--ranks", "1", "--workers", "0",
                     f"data.train=[{{paths: ['{folder}']}}]"]) == 0
    out = capsys.readouterr().out
    assert "2 files" in out and f"per epoch: 100 documents, about 2,000 tokens (from {folder}/manifest.json)" in out
    # one shard of the two: its own count, from the per-file entries
    (plan,) = job_sources(DataConfig(train=[SourceConfig(paths=[str(folder / "01.jsonl.zst")])]), 1, 0)
    assert plan.documents == 50 and "1 of its 2 files" in plan.manifest
    # a manifest that does not describe the files is not used
    (folder / "manifest.json").write_text(json.dumps({"documents": 7, "files": ["other.parquet"]}))
    (plan,) = job_sources(DataConfig(train=[SourceConfig(paths=[str(folder)])]), 1, 0)
    assert plan.documents is None and "not used" in plan.manifest


def test_the_loader_warns_once_on_rank_0_with_the_prepare_command(tmp_path, caplog, monkeypatch, tiny_pieces):
    folder = _zst_corpus(tmp_path, 2)
    cfg = DataConfig(train=[SourceConfig(paths=[f"{folder}/*.jsonl.zst"])], validation=[], tokenizer_path=SPIECE,
                     max_seq_length=32, num_workers=2)
    monkeypatch.setattr(loader_mod, "QUIET_EXTRA_BYTES", 0)  # the real corpora this is about are GBs
    for rank in range(2):
        caplog.clear()
        with caplog.at_level(logging.INFO):
            loader_mod.build_train_loader(cfg, 2, rank=rank, world_size=2)
        warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
        if rank == 0:
            assert len(warnings) == 1, warnings
            assert warnings[0].startswith("read amplification: data.train[0]: every epoch reads its ")
            assert "2.0 times (2 pieces (2 compressed files, which cannot be split) for 4 slots" in warnings[0]
            assert f"albert-dist data prepare --input '{folder}/*.jsonl.zst' --output {folder}-prepared " \
                   "--target-ranks 2 --target-loader-workers 2" in warnings[0]
        else:
            assert warnings == []
        assert "(each shared with 1 other slots)" in caplog.text


def test_a_source_too_small_for_its_slots_gets_no_prepare_command(capsys):
    """The 1.1 MB sample at 64 ranks x 8 workers: under 64 KiB a slot, pieces are shared; prepare cannot help."""
    assert cli.main(["data", "plan", "--config", RECIPE, "--ranks", "64", "--workers", "8"]) == 0
    out = capsys.readouterr().out
    assert "too small to give 512 slots a piece each" in out and "albert-dist data prepare" not in out


def test_a_bundled_sample_job_reads_every_byte_once(capsys):
    """The quickstart (2 ranks x 2 workers) plans several byte ranges per slot: no amplification, no warning."""
    assert cli.main(["data", "plan", "--config", RECIPE, "--ranks", "2", "--workers", "2"]) == 0
    out = capsys.readouterr().out
    assert "read amplification: 1.00" in out and "data prepare" not in out  # (a checkout path may hold "prepare")


def test_data_group_usage_and_a_missing_prepare(capsys):
    import importlib.util

    assert cli.main(["data"]) == 2 and "usage: albert-dist data [-h] {prepare,plan}" in capsys.readouterr().err
    assert cli.main(["data", "--help"]) == 0 and "usage: albert-dist data" in capsys.readouterr().out
    if importlib.util.find_spec("albert_dist.data.prepare") is None:
        assert cli.main(["data", "prepare", "--input", "x"]) == 2
        assert "albert-dist data prepare: not available" in capsys.readouterr().err
