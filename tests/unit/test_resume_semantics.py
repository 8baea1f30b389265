"""The one table of what a config change means on resume (`albert_dist.config.resume_rules`, from each field's
`on_resume` tag): every field of the table is changed on resume from a checkpoint, alone, and gets the behaviour
its row documents, never a traceback; the loader fingerprint and the config hash follow the same table; the
table in docs/checkpoints.md is the code's.

Single process, checkpoints laid out as `save_checkpoint` writes them (the plan reads only the metadata). The
real resumes (the new lr used from the next step, a converted checkpoint, a stream restart) run on 2 gloo ranks
in tests/distributed/test_checkpoint.py.
"""
from __future__ import annotations

import copy
import json
import logging
import shutil
from pathlib import Path
from typing import Any, Literal, Union, get_args, get_origin, get_type_hints

import pytest
from omegaconf import OmegaConf

from albert_dist import cli
from albert_dist.apps.pretrain import main as train
from albert_dist.config import TrainConfig, config_hash, load_config, resume_rules, resume_table_markdown, to_container
from albert_dist.data.config import DataConfig
from albert_dist.data.loader import FINGERPRINT_FIELDS, PretrainingStream
from albert_dist.engine.checkpoint.drift import ConfigDriftError
from albert_dist.engine.checkpoint.layout import META_FILE
from albert_dist.engine.checkpoint.resume import plan_load
from albert_dist.distributed import group as distributed
from albert_dist.on_resume import APPLIES, CONVERT, QUIET, REFUSE, RESTART_STREAMS, RULES, flatten

REPO = Path(__file__).resolve().parents[2]
RECIPE = str(REPO / "configs/pretrain/albert-tiny-wikitext.yaml")
TABLE = resume_rules()
SAMPLE = REPO / "data/sample"

#: Values for fields whose changed value the type alone does not give (a valid config must result).
CHANGED: dict[str, Any] = {
    "model.vocab_size": 30001,
    "model.hidden_size": 384,
    "model.num_hidden_layers": 6,  # a multiple of the 1 group
    "model.num_hidden_groups": 2,  # divides the 12 layers
    "model.num_attention_heads": 6,
    "model.max_position_embeddings": 256,
    "data.train": [{"paths": [str(SAMPLE / "wikitext-2-validation.txt")]}],
    "data.validation": [],
    "data.tokenizer_path": "/elsewhere/other-spiece.model",
    "optimizer.betas": [0.8, 0.99],
    "optimizer.warmup_ratio": 0.1,  # with warmup_steps 0
    "engine.zero_stage": 2,  # the checkpoint below is ZeRO-3
    "engine.zero_optimization.extra": {"stage3_max_live_parameters": 100_000_000},
    "engine.train_batch_size": 16,
    "engine.train_micro_batch_size_per_gpu": 4,  # on 4 ranks: the same global batch (see WORLD)
    "checkpoint.on_save_error": "continue",  # = micro 8 x accumulation 1 x the 2 ranks it is resumed on
    "engine.offload_param.device": "cpu",  # needs ZeRO-3: the checkpoint below is written at ZeRO-3
    "engine.offload_optimizer.device": "cpu",
    "checkpoint.dir": "/elsewhere/checkpoints",
    "checkpoint.resume": "auto",
    "run_dir": "/elsewhere/run",
    "data.cache_dir": "/elsewhere/cache",
    "tracking.tracking_uri": "sqlite:////elsewhere/mlruns.db",
    "tracking.run_name": "renamed",
    "tracking.experiment_name": "other",
    "tracking.keep_last_checkpoints": 2,
    "tracking.max_backoff_s": 60.0,
    "model.init_from": "/elsewhere/albert",
}


#: Fields that keep the global batch only on another number of ranks (the checkpoint is written by 2).
WORLD = {"engine.gradient_accumulation_steps": 1, "engine.train_micro_batch_size_per_gpu": 4}


def _leaf_type(key: str) -> Any:
    cls = TrainConfig
    parts = key.split(".")
    for part in parts[:-1]:
        cls = get_type_hints(cls)[part]
    return get_type_hints(cls)[parts[-1]]


def changed_value(key: str, value: Any) -> Any:
    """A different value for `key` that keeps the config valid."""
    if key in CHANGED:
        return CHANGED[key]
    hint = _leaf_type(key)
    if get_origin(hint) is Union:  # Optional[X]: X
        hint = next(a for a in get_args(hint) if a is not type(None))
    if get_origin(hint) is Literal:
        return next(o for o in get_args(hint) if o != value)
    if value is None:  # left at DeepSpeed's / the loader's default
        return {bool: True, int: 1000, float: 0.5}[hint]
    if isinstance(value, bool):
        return not value
    if isinstance(value, int):
        return value + 1
    if isinstance(value, float):
        return value / 2 if value > 0 else 0.1
    if isinstance(value, str):
        return value + "-other"
    raise AssertionError(f"no changed value for {key}={value!r}: add it to CHANGED")


def _set(config: dict, key: str, value: Any) -> dict:
    out = copy.deepcopy(config)
    node = out
    *parents, leaf = key.split(".")
    for p in parents:
        node = node[p]
    node[leaf] = value
    return out


def _validated(config: dict) -> TrainConfig:
    return OmegaConf.to_object(OmegaConf.merge(OmegaConf.structured(TrainConfig), config))


@pytest.fixture(scope="module")
def base() -> dict:
    """The resolved config a checkpoint was written with (ZeRO-3, so that the offload options are valid; the block
    compile scope, the one ZeRO-3 compiles with, so that switching `engine.compile` on is valid)."""
    return to_container(load_config(None, ["engine.zero_stage=3", "engine.compile_scope=block"]))


def write_checkpoint(ckpt_dir: Path, config: dict, step: int = 8, world_size: int = 2) -> Path:
    """A verified checkpoint directory as save_checkpoint leaves it (metadata + listed files)."""
    tag_dir = ckpt_dir / f"step_{step}"
    tag_dir.mkdir(parents=True)
    files = {"mp_rank_00_model_states.pt": 30, "zero_pp_rank_0_mp_rank_00_optim_states.pt": 50}
    for name, size in files.items():
        (tag_dir / name).write_bytes(b"x" * size)
    meta = {"format": 2, "step": step, "world_size": world_size, "zero_stage": config["engine"]["zero_stage"],
            "config_hash": "h", "config": config, "files": files}
    (tag_dir / META_FILE).write_text(json.dumps(meta))
    return tag_dir


def test_every_field_has_one_rule_and_every_rule_is_known(base):
    assert set(TABLE) == set(flatten(base)), "the table and the config's fields differ"
    assert {rule for rule, _ in TABLE.values()} == set(RULES)  # every rule is used by some field
    assert TABLE["optimizer.lr"][0] == APPLIES and TABLE["data.whole_word_masking"][0] == RESTART_STREAMS
    assert TABLE["checkpoint.resume"][0] == TABLE["run_dir"][0] == TABLE["log_interval_steps"][0] == QUIET


@pytest.fixture(scope="module")
def base_hash(base) -> str:
    return config_hash(_validated(base))


@pytest.mark.parametrize("key", sorted(TABLE))
def test_changing_a_field_on_resume_does_what_its_row_says(key, base, base_hash, tmp_path, caplog):
    rule, note = TABLE[key]
    old = flatten(base)[key]
    changed = _set(base, key, changed_value(key, old))
    changed_hash = config_hash(_validated(changed))  # validated: a config a user could write
    point_dir = write_checkpoint(tmp_path / "checkpoints", base)
    world = WORLD.get(key, 2)
    with caplog.at_level(logging.WARNING):
        if rule == REFUSE:
            with pytest.raises(ConfigDriftError) as err:
                plan_load(str(point_dir), None, changed, world, TABLE)
            assert f"has {key}={old!r}, the config has {key}={flatten(changed)[key]!r}" in str(err.value)
            assert (note in str(err.value)) if note else True
            return
        plan = plan_load(str(point_dir), None, changed, world, TABLE)
    warned = "\n".join(r.getMessage() for r in caplog.records)
    assert plan.point is not None and plan.point.step == 8
    assert plan.drift.streams_restart == (rule == RESTART_STREAMS)
    assert plan.universal == (rule == CONVERT or world != 2)  # another number of ranks converts too
    if rule == QUIET:
        assert warned == "" and plan.drift.changes == {}
    elif rule == RESTART_STREAMS:
        assert f"the data streams restart from the corpus start because {key} changed" in warned
    elif rule == CONVERT:
        assert f"{key} changed" in warned and "converts the checkpoint with DeepSpeed's universal-checkpoint" in warned
    else:
        assert f"{key} changed" in warned and f"the run {note or 'uses the new value from the next step'}" in warned
    # The config hash names the trajectory: quiet fields leave it alone, any other change moves it.
    assert (changed_hash == base_hash) == (rule == QUIET)


def test_no_change_says_nothing(base, tmp_path, caplog):
    with caplog.at_level(logging.WARNING):
        plan = plan_load("auto", tmp_path / "checkpoints", base, 2, TABLE)  # nothing there: fresh start
        assert plan.point is None
        write_checkpoint(tmp_path / "checkpoints", base)
        caplog.clear()
        plan = plan_load("auto", tmp_path / "checkpoints", base, 2, TABLE)
    assert plan.point.tag == "step_8" and plan.drift.changes == {} and not plan.universal
    assert caplog.records == []


def test_a_zero_stage_change_is_exit_2_before_any_process_group_naming_the_field(tmp_path, capsys, monkeypatch):
    for var in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "SLURM_PROCID", "SLURM_NTASKS"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setattr(distributed, "init_distributed", lambda *a, **k: pytest.fail("process group started"))
    monkeypatch.setattr(train.Trainer, "setup", lambda self: pytest.fail("Trainer.setup reached"))
    args = ["--config", RECIPE, "tracking.enabled=false"]
    point = write_checkpoint(tmp_path / "checkpoints", to_container(load_config(RECIPE, args[2:])), world_size=1)
    assert cli.main(["train", *args, "--resume", str(point), "engine.zero_stage=3"]) == train.EXIT_CONFIG_ERROR
    err = capsys.readouterr().err
    assert err.startswith(f"albert-dist train: checkpoint {point} has engine.zero_stage=2, the config has "
                          f"engine.zero_stage=3") and "DeepSpeed 0.19.8 loads no checkpoint" in err
    assert "Traceback" not in err and err.count("\n") == 1


def test_a_fresh_run_into_a_run_dir_with_checkpoints_is_exit_2_before_any_process_group(tmp_path, capsys,
                                                                                         monkeypatch):
    """Without --resume, a run_dir that holds an earlier run's checkpoints is refused: the new run would
    overwrite that run's metrics.jsonl and final model and leave its checkpoints beside its own."""
    for var in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "SLURM_PROCID", "SLURM_NTASKS"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setattr(distributed, "init_distributed", lambda *a, **k: pytest.fail("process group started"))
    monkeypatch.setattr(train.Trainer, "setup", lambda self: pytest.fail("Trainer.setup reached"))
    args = ["--config", RECIPE, "tracking.enabled=false", f"run_dir={tmp_path}"]
    write_checkpoint(tmp_path / "checkpoints", to_container(load_config(RECIPE, args[2:])), world_size=1)
    assert cli.main(["train", *args]) == train.EXIT_CONFIG_ERROR
    err = capsys.readouterr().err
    assert err == (f"albert-dist train: {tmp_path / 'checkpoints'} already holds an earlier run's checkpoints "
                   "(step_8 newest): --resume auto continues that run; a new run needs another run_dir\n")


def _stream(data: DataConfig, micro: int = 2) -> PretrainingStream:
    return PretrainingStream(data, "train", micro, 0, 1)


@pytest.mark.parametrize("key", sorted(k for k in TABLE if k.startswith("data.")) + ["engine.train_micro_batch_size_per_gpu"])
def test_the_loader_state_loads_after_a_change_unless_the_streams_restart(key, tmp_path):
    """The training loader refuses a saved position whose fingerprint differs (ValueError, and the job would
    stop): a field's change may alter the fingerprint only when the table restarts the streams for it. Its
    slot layout (num_workers) is checked when iterating, so it restarts them too."""
    sample = to_container(load_config(RECIPE, ["data.num_workers=0"]))
    tokenizer = tmp_path / "other-spiece.model"
    shutil.copy(SAMPLE / "spiece.model", tokenizer)
    value = changed_value(key, flatten(sample)[key])
    value = str(tokenizer) if key == "data.tokenizer_path" else value
    changed = _validated(_set(sample, key, value))
    before, after = _validated(sample), changed
    old = _stream(before.data, before.engine.train_micro_batch_size_per_gpu)
    new = _stream(after.data, after.engine.train_micro_batch_size_per_gpu)
    rule = TABLE[key][0]
    if key == "data.num_workers":
        assert key.split(".")[1] not in FINGERPRINT_FIELDS and rule == RESTART_STREAMS
        return
    assert (old.fingerprint != new.fingerprint) == (rule == RESTART_STREAMS), key
    if rule == RESTART_STREAMS:
        with pytest.raises(ValueError, match="data loader state was saved with another data config"):
            new.load_state_dict(old.state_dict())
    else:
        new.load_state_dict(old.state_dict())


def test_docs_table_is_the_codes():
    doc = (REPO / "docs/checkpoints.md").read_text()
    start, end = "<!-- resume-table: generated by albert_dist.config.resume_table_markdown -->", "<!-- /resume-table -->"
    assert start in doc and end in doc
    shown = doc.split(start, 1)[1].split(end, 1)[0].strip("\n") + "\n"
    assert shown == resume_table_markdown(), "docs/checkpoints.md is stale; paste:\n" + resume_table_markdown()
