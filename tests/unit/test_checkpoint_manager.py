"""Checkpoint planning, verification, retention and config drift on checkpoint directories laid out as
`albert_dist.engine.checkpoint.save_checkpoint` writes them (single process, no DeepSpeed engine: the files'
contents do not matter to these rules, only their names, sizes and the metadata).

The distributed tests (tests/distributed/test_checkpoint.py) resume real DeepSpeed checkpoints through these rules.
"""
from __future__ import annotations

import json
import logging
from pathlib import Path

import pytest

from albert_dist.config import TrainConfig, resume_rules, to_container
from albert_dist.engine.checkpoint.drift import ConfigDriftError, check_drift, log_drift
from albert_dist.engine.checkpoint.layout import CheckpointError, META_FILE, write_latest
from albert_dist.engine.checkpoint.manager import CheckpointManager
from albert_dist.engine.checkpoint.choose import choose_checkpoint, checkpoint_at
from albert_dist.engine.checkpoint.resume import plan_load
from albert_dist.engine.checkpoint.retention import checkpoint_bytes, free_bytes, last_checkpoint_bytes, make_room, prune
from albert_dist.engine.checkpoint import retention
from albert_dist.apps.pretrain.trainer import every

RULES = resume_rules()

FILES = {"mp_rank_00_model_states.pt": 300, "zero_pp_rank_0_mp_rank_00_optim_states.pt": 500,
         "zero_pp_rank_1_mp_rank_00_optim_states.pt": 500}


def make_ckpt(ckpt_dir: Path, step: int, config: dict | None = None, world_size: int = 2) -> Path:
    """A checkpoint directory with FILES and format-2 metadata, as save_checkpoint leaves it."""
    tag_dir = ckpt_dir / f"step_{step}"
    tag_dir.mkdir(parents=True)
    for name, size in FILES.items():
        (tag_dir / name).write_bytes(b"x" * size)
    meta = {"format": 2, "step": step, "world_size": world_size, "zero_stage": 2, "config_hash": "h",
            "config": config or {}, "files": dict(FILES)}
    (tag_dir / META_FILE).write_text(json.dumps(meta))
    return tag_dir


def truncate(path: Path, size: int = 100) -> None:
    with open(path, "r+b") as fh:
        fh.truncate(size)


@pytest.fixture
def ckpt_dir(tmp_path) -> Path:
    d = tmp_path / "checkpoints"
    make_ckpt(d, 5)
    make_ckpt(d, 10)
    write_latest(d, "step_10")
    return d


def test_newest_checkpoint_truncated_resume_auto_takes_the_previous_one_and_says_why(ckpt_dir, caplog):
    truncate(ckpt_dir / "step_10" / "zero_pp_rank_1_mp_rank_00_optim_states.pt")
    with caplog.at_level(logging.WARNING, logger="albert_dist.engine.checkpoint"):
        point = choose_checkpoint("auto", ckpt_dir)
    assert (point.tag, point.step) == ("step_5", 5)
    skipped = [r.getMessage() for r in caplog.records if "skipping checkpoint" in r.getMessage()]
    assert skipped == [f"skipping checkpoint {ckpt_dir / 'step_10'}: zero_pp_rank_1_mp_rank_00_optim_states.pt "
                       f"has 100 bytes, albert_dist.json lists 500 (truncated or rewritten)"]
    write_latest(ckpt_dir, "step_15")  # and `latest` names a step that does not exist (a crash mid-save)
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="albert_dist.engine.checkpoint"):
        assert choose_checkpoint("auto", ckpt_dir, log=False).tag == "step_5"
    assert caplog.records == []  # log=False: ranks other than 0 say nothing (the job says it once)


def test_latest_naming_a_missing_step_falls_back_to_the_newest_verified(ckpt_dir, caplog):
    write_latest(ckpt_dir, "step_15")
    with caplog.at_level(logging.WARNING, logger="albert_dist.engine.checkpoint"):
        point = choose_checkpoint("auto", ckpt_dir)
    assert point.tag == "step_10"
    assert any("names step_15, which does not exist" in r.getMessage() for r in caplog.records)


def test_a_save_that_never_wrote_its_metadata_is_skipped(ckpt_dir, caplog):
    (ckpt_dir / "step_15").mkdir()  # a crash before the metadata: DeepSpeed's files only
    (ckpt_dir / "step_15" / "mp_rank_00_model_states.pt").write_bytes(b"x" * 300)
    with caplog.at_level(logging.WARNING, logger="albert_dist.engine.checkpoint"):
        assert choose_checkpoint("auto", ckpt_dir).tag == "step_10"
    assert any(f"{ckpt_dir / 'step_15'}: no albert_dist.json" in r.getMessage() for r in caplog.records)


def test_explicit_checkpoint_that_does_not_verify_is_an_error_naming_it(ckpt_dir):
    (ckpt_dir / "step_10" / "mp_rank_00_model_states.pt").unlink()
    with pytest.raises(CheckpointError, match=r"step_10 does not verify: mp_rank_00_model_states.pt is missing"):
        choose_checkpoint(str(ckpt_dir / "step_10"), ckpt_dir)
    assert choose_checkpoint(str(ckpt_dir), "unused").tag == "step_5"  # a directory: searched like auto


def test_no_checkpoint_verifies_is_an_error_listing_each(tmp_path):
    d = tmp_path / "c"
    for step in (3, 6):
        truncate(make_ckpt(d, step) / "mp_rank_00_model_states.pt")
    with pytest.raises(CheckpointError, match=r"no checkpoint in .* verifies \(step_6: .*; step_3: .*\)"):
        choose_checkpoint("auto", d, log=False)
    assert choose_checkpoint("auto", tmp_path / "empty") is None  # nothing there at all: a fresh start


def test_a_first_save_cut_short_is_a_fresh_start_not_a_dead_end(tmp_path, caplog):
    """A rank SIGSTOPped inside the run's first save (the watchdog's 76) leaves step_3/ with DeepSpeed's files and
    no albert_dist.json, and no `latest`. Without --resume the run_dir is refused (it holds a step directory), so
    --resume auto must start from step 0 (it raised "no checkpoint ... verifies": exit 2 both ways, and a restart
    or requeue stopped there). A run that once had a complete checkpoint still raises (next test)."""
    d = tmp_path / "c"
    (d / "step_3").mkdir(parents=True)
    (d / "step_3" / "mp_rank_00_model_states.pt").write_bytes(b"x" * 300)
    with caplog.at_level(logging.WARNING, logger="albert_dist.engine.checkpoint"):
        assert choose_checkpoint("auto", d) is None
    assert [r.getMessage() for r in caplog.records if "ever completed" in r.getMessage()] == [
        f"no checkpoint in {d} ever completed its save (step_3: no albert_dist.json (its save did not complete)): "
        "starting from step 0"]
    write_latest(d, "step_3")  # `latest` once named a complete checkpoint: not a first save
    with pytest.raises(CheckpointError, match=r"no checkpoint in .* verifies \(step_3: no albert_dist.json"):
        choose_checkpoint("auto", d, log=False)


def test_retention_keeps_the_resumed_checkpoint_and_drops_the_corrupt_newer_one(ckpt_dir):
    """Resumed from step_5 because step_10 is corrupt; keep_last=1: step_5 is the only good copy."""
    truncate(ckpt_dir / "step_10" / "mp_rank_00_model_states.pt")
    (ckpt_dir / "step_10_universal").mkdir()
    assert prune(ckpt_dir, keep_last=1, protect="step_5") == ["step_10", "step_10_universal"]
    assert sorted(p.name for p in ckpt_dir.iterdir() if p.is_dir()) == ["step_5"]


def test_retention_releases_the_resumed_checkpoint_once_a_newer_one_verifies(ckpt_dir):
    make_ckpt(ckpt_dir, 15)
    assert prune(ckpt_dir, keep_last=2, protect="step_5") == ["step_5"]
    assert prune(ckpt_dir, keep_last=1, protect="step_10") == ["step_10"]  # step_15 is newer and verified
    assert sorted(p.name for p in ckpt_dir.iterdir()) == ["latest", "step_15"]


def test_retention_deletes_nothing_when_nothing_verifies(tmp_path):
    d = tmp_path / "c"
    truncate(make_ckpt(d, 3) / "mp_rank_00_model_states.pt")
    assert prune(d, keep_last=1) == [] and (d / "step_3").is_dir()


# ------------------------------------------------------------------------------- disk headroom (issue 20)
def _quota(monkeypatch, ckpt_dir: Path, quota: int) -> None:
    """A file system of `quota` bytes holding only `ckpt_dir` (what a small tmpfs reports as free). Patched in
    its module: `retention.free_bytes` would cache the patched function in the package."""

    def free_bytes(path) -> int:
        return quota - sum(p.stat().st_size for p in Path(ckpt_dir).rglob("*") if p.is_file())

    monkeypatch.setattr(retention, "free_bytes", free_bytes)


def _dirs(ckpt_dir: Path) -> list[str]:
    return sorted((p.name for p in ckpt_dir.iterdir() if p.is_dir()), key=lambda n: (len(n), n))


def test_headroom_removes_unverified_then_oldest_before_the_save_never_the_newest(ckpt_dir, monkeypatch, caplog):
    make_ckpt(ckpt_dir, 15)
    (ckpt_dir / "step_20").mkdir()  # a save cut short: DeepSpeed's first file only
    (ckpt_dir / "step_20" / "mp_rank_00_model_states.pt").write_bytes(b"x" * 300)
    size = checkpoint_bytes(ckpt_dir / "step_15")
    assert size == sum(FILES.values()) + (ckpt_dir / "step_15" / META_FILE).stat().st_size
    # room for 3 checkpoints in all: step_5 and step_10 must go for step_15 + the new one, step_20 first of all
    _quota(monkeypatch, ckpt_dir, 3 * size + 100)
    assert last_checkpoint_bytes(ckpt_dir) == ("step_15", size)
    with caplog.at_level(logging.WARNING, logger="albert_dist.engine.checkpoint"):
        removed = make_room(ckpt_dir, size, keep_last=3)
    assert removed == ["step_20", "step_5"]
    assert _dirs(ckpt_dir) == ["step_10", "step_15"]
    assert retention.free_bytes(ckpt_dir) >= size
    msg = [r.getMessage() for r in caplog.records]
    assert len(msg) == 1 and "removed step_20, step_5 before saving" in msg[0] and "keep_last=3" in msg[0], msg
    assert make_room(ckpt_dir, size, keep_last=3) == []  # enough room now: nothing else goes


def test_headroom_keeps_the_resumed_checkpoint_and_says_when_the_room_is_still_short(ckpt_dir, monkeypatch, caplog):
    make_ckpt(ckpt_dir, 15)
    size = checkpoint_bytes(ckpt_dir / "step_15")
    _quota(monkeypatch, ckpt_dir, 3 * size - 10)  # short by more than 10 bytes, even after removing step_10
    with caplog.at_level(logging.WARNING, logger="albert_dist.engine.checkpoint"):
        assert make_room(ckpt_dir, size, keep_last=3, protect="step_5") == ["step_10"]
    assert _dirs(ckpt_dir) == ["step_5", "step_15"]  # the resumed-from one and the newest verified one
    short = [r.getMessage() for r in caplog.records if "will probably fail" in r.getMessage()]
    assert len(short) == 1 and "kept: step_5, step_15" in short[0], caplog.text


def test_free_bytes_of_a_directory_not_made_yet_is_its_file_systems(tmp_path):
    import shutil

    assert abs(free_bytes(tmp_path / "a" / "b") - shutil.disk_usage(tmp_path).free) < 2**24


@pytest.mark.parametrize("rank", [0, 1])
def test_a_lowered_keep_last_applies_when_the_job_resumes(ckpt_dir, rank):
    """Three checkpoints, resumed with keep_last=2: rank 0 removes step_5 before the engine is even built (so
    before any save); the other ranks delete nothing."""
    from albert_dist.engine.config import CheckpointConfig

    class EngineBuilt(Exception):
        pass

    def build_engine(overrides):
        raise EngineBuilt  # the test looks at the directory as it is when the engine would be built

    make_ckpt(ckpt_dir, 15)
    config = _config()
    plan = plan_load("auto", ckpt_dir, config, 2, resume_rules(), log=False)
    assert plan.point.tag == "step_15"
    manager = CheckpointManager(CheckpointConfig(keep_last=2), ckpt_dir, rank=rank, world_size=2,
                                     config=config, config_hash="h", seed=0, plan=plan)
    with pytest.raises(EngineBuilt):
        manager.resume(build_engine, build_loader=None)
    assert _dirs(ckpt_dir) == (["step_10", "step_15"] if rank == 0 else ["step_5", "step_10", "step_15"])


def _config(**changes) -> dict:
    cfg = to_container(TrainConfig())
    for dotted, value in changes.items():
        node = cfg
        *parents, leaf = dotted.split("__")
        for p in parents:
            node = node[p]
        node[leaf] = value
    return cfg


def test_model_field_drift_is_refused_naming_each_field_with_both_values(tmp_path):
    point = checkpoint_at(make_ckpt(tmp_path, 8, _config()).parent, "step_8")
    current = _config(model__sharing="none", model__hidden_size=64)
    with pytest.raises(ConfigDriftError) as err:
        check_drift(point, current, 2, RULES)
    msg = str(err.value)
    assert f"checkpoint {tmp_path / 'step_8'} has model.hidden_size=768, the config has model.hidden_size=64" in msg
    assert "model.sharing='all', the config has model.sharing='none'" in msg


def test_resumable_fields_warn_with_what_the_run_does(tmp_path, caplog):
    point = checkpoint_at(make_ckpt(tmp_path, 8, _config()).parent, "step_8")
    drift = check_drift(point, _config(max_steps=2000, log_interval_steps=5, optimizer__lr=2e-3), 2, RULES)
    assert sorted(drift.changes) == ["max_steps", "optimizer.lr"]  # log_interval_steps cannot matter: quiet
    assert drift.changes["max_steps"] == (1000, 2000) and not drift.streams_restart
    with caplog.at_level(logging.WARNING, logger="albert_dist.engine.checkpoint"):
        log_drift(point, drift)
    text = "\n".join(r.getMessage() for r in caplog.records)
    assert "max_steps changed (1000 -> 2000): the run trains on to the new max_steps; the learning rate follows" in text
    assert "optimizer.lr changed (0.001 -> 0.002): the run uses the new peak lr from the next step" in text
    assert "log_interval_steps" not in text
    assert check_drift(point, _config(data__num_workers=0), 2, RULES).streams_restart


def test_accumulation_may_change_only_with_the_same_global_batch(tmp_path):
    base = _config()
    micro, ga = base["engine"]["train_micro_batch_size_per_gpu"], base["engine"]["gradient_accumulation_steps"]
    point = checkpoint_at(make_ckpt(tmp_path, 8, base, world_size=2).parent, "step_8")
    ok = check_drift(point, _config(engine__gradient_accumulation_steps=ga * 2), world_size=1, rules=RULES)
    assert "engine.gradient_accumulation_steps" in ok.changes
    with pytest.raises(ConfigDriftError, match=f"global batch of {micro * ga * 2} sequences"):
        check_drift(point, _config(engine__gradient_accumulation_steps=ga * 2), world_size=2, rules=RULES)


def test_a_new_number_of_ranks_that_changes_the_global_batch_is_warned(tmp_path, caplog):
    base = _config()
    batch = base["engine"]["train_micro_batch_size_per_gpu"] * base["engine"]["gradient_accumulation_steps"]
    point = checkpoint_at(make_ckpt(tmp_path, 8, base, world_size=2).parent, "step_8")
    with caplog.at_level(logging.WARNING, logger="albert_dist.engine.checkpoint"):
        log_drift(point, check_drift(point, _config(), 2, RULES))  # same ranks: nothing to say
        assert caplog.records == []
        log_drift(point, check_drift(point, _config(), world_size=1, rules=RULES))
    assert [r.getMessage() for r in caplog.records] == [
        f"checkpoint {tmp_path / 'step_8'} was trained with a global batch of {2 * batch} sequences (2 ranks); on 1 "
        f"ranks it continues with {batch} (the learning rate is not rescaled); to keep {2 * batch} set "
        "engine.gradient_accumulation_steps"]


def test_every_is_the_one_cadence_rule():
    assert [s for s in range(1, 11) if every(s, 3)] == [3, 6, 9]
    assert [s for s in range(1, 11) if every(s, 3, last=s == 10)] == [3, 6, 9, 10]
    assert [s for s in range(1, 11) if every(s, 0, last=s == 10)] == [10]
