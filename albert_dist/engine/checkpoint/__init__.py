"""Checkpoints through the DeepSpeed engine, with the training state DeepSpeed does not know about.

`CheckpointManager` is the one place that decides about checkpoints: its `resume()` is the job's one resume
call (fetching an MLflow run's checkpoint first when asked; building the engine with the DeepSpeed-config
overrides the resume needs; loading the engine, the data loaders and, last, the RNGs), and `maybe_save()`
saves on the loop's cadence and applies retention. The resume itself is planned once, before any process group
(`resume_plan`). The package's modules are its parts, usable on their own (bench, tests, tools):

    layout.py     tags, `latest`, `albert_dist.json`, verification (torch-free: tracking uses it too)
    state.py      TrainState (what DeepSpeed does not save), RNG states and seeds
    plan.py       ResumePoint, newest_verified, plan_resume (no process group needed)
    drift.py      what a config change means on resume
    resume.py     resume_plan (plan + drift, made before the process group), Resumed, rng_kept
    save.py       the collective save protocol;  retention.py  which checkpoints are kept
    load.py       universal conversion, engine load, the current config's lr and optimiser hyper-parameters
    manager.py    CheckpointManager and the loop's cadence rule `every`

Every public name is importable from the package (`from albert_dist.engine import checkpoint as ckpt; ckpt.X`),
resolved lazily so that `layout` stays torch-free.

Layout of `<checkpoint dir>` (default `<run_dir>/checkpoints`)::

    step_<N>/                 one DeepSpeed checkpoint (engine.save_checkpoint(tag="step_<N>")), + albert_dist.json
    step_<N>_universal/       the same converted by DeepSpeed's ds_to_universal, made when resuming elsewhere
    latest                    the tag of the newest *verified* checkpoint (DeepSpeed's format: the tag, no newline)

`albert_dist.json` (`META_FILE`) = {"format", "step", "world_size", "zero_stage", "config_hash", "reason" (why it
was written: "interval", "final" or "stop", the last for a stop signal's), "config" (the
resolved TrainConfig: the model and data-shape snapshot the drift check compares), "files": {relative path:
bytes} of every other file of the tag directory}. A checkpoint *verifies* when its metadata reads and every
listed file exists with the listed size (`verify`): this catches what real clusters leave behind, a save cut
short by a dead node, a truncated copy, a deleted step. No content checksum: reading a checkpoint back costs
far more than the 5 % of the save time such a check may take (measured in docs/checkpoints.md).

Save protocol (`save_checkpoint`, collective: every rank writes its own ZeRO partition): (1) every rank's
data-loader and RNG states are gathered into the `TrainState`; (2) rank 0 removes a stale directory of the same
tag and its universal copy (an earlier attempt's, now stale), and, when the free space is below the size of the
last verified checkpoint, deletes older checkpoints first (`make_room`: never the newest verified one nor the one
the job resumed from); (3) `engine.save_checkpoint(..., save_latest=False)`
with DeepSpeed's writer wrapped so an `OSError` (or the `RuntimeError` torch's zip writer raises on a full
disk) is recorded instead of leaving the other ranks in DeepSpeed's barrier; (4) barrier; (5) the ranks agree
on the first error; (6) rank 0 lists the files, writes `albert_dist.json`, verifies it and only then moves
`latest` atomically (temporary file, fsync, `os.replace`); (7) on any error the partial directory is removed,
`latest` still names the previous checkpoint, and every rank raises the same `CheckpointSaveError` (one line:
the path and the errno; "disk full" for ENOSPC, with the bytes a checkpoint needs and those free); (8) rank 0 applies retention (`prune`); (9) barrier.
DeepSpeed's own `latest` (written from rank 0 without waiting for the others) is not used.

Resume (`plan_resume`, no process group needed): "auto" takes the newest `step_<N>` directory that verifies,
logging each newer one it skips and why (whatever `latest` says: a `latest` naming a missing step falls back
the same way). Retention (`prune`) never deletes the newest verified checkpoint, nor the one the job resumed
from until a newer verified one exists; unverified directories are removed. It also runs when a job resumes, so
a lowered `checkpoint.keep_last` frees its space before the first save.

Resume on another number of ranks (the saved world size differs), or with a changed field whose resume rule is
"convert" (a ZeRO partition-layout option, `albert_dist.on_resume`; `ResumePlan.universal`): rank 0 converts the checkpoint with
DeepSpeed's universal-checkpoint tool (`deepspeed.checkpoint.ds_to_universal`), and the engine is built with
`checkpoint.load_universal=true` (`CheckpointManager.resume` passes it to the engine factory), which re-partitions parameters
and optimiser moments for the new world size. The converter needs the module to carry a
`universal_checkpoint_info` attribute when the engine is built (`UNIVERSAL_CHECKPOINT_INFO`). The data streams
continue by the rule of `albert_dist.engine.checkpoint.reshard`; dropout RNGs are re-seeded from (seed, rank, step),
since the old ranks' RNG streams cannot be split or merged.

Learning rate after a resume: the schedule is a function of the step and the *current* config, so after
loading, the schedule's peak lr is the config's `optimizer.lr` again (DeepSpeed restores the checkpoint's) and
every parameter group's lr is set to `lr * lr_factor(step, warmup_steps, max_steps)` of the current config
(`load._follow_config_schedule`). With an unchanged config this is exactly the value the interrupted run would
have used; with a larger `max_steps` the resumed run follows the longer schedule from the checkpoint's step on
(DeepSpeed alone would run the first resumed step at the old schedule's last lr, e.g. 0.0), and a changed
`optimizer.lr` is used from the next step.
"""
import importlib
from typing import Any

#: public name -> the module of this package that defines it
_HOME: dict[str, str] = {
    "LATEST": "layout",
    "META_FILE": "layout",
    "META_FORMAT": "layout",
    "CheckpointError": "layout",
    "fsync_dir": "layout",
    "list_files": "layout",
    "payload_files": "layout",
    "read_latest": "layout",
    "read_meta": "layout",
    "step_dirs": "layout",
    "step_of": "layout",
    "tag_for": "layout",
    "verify": "layout",
    "write_latest": "layout",
    "CLIENT_KEY": "state",
    "TrainState": "state",
    "rng_state": "state",
    "seed_all": "state",
    "seed_for": "state",
    "set_rng_state": "state",
    "ResumePoint": "plan",
    "newest_verified": "plan",
    "plan_resume": "plan",
    "resume_point": "plan",
    "ResumePlan": "resume",
    "Resumed": "resume",
    "resume_plan": "resume",
    "rng_kept": "resume",
    "ConfigDriftError": "drift",
    "Drift": "drift",
    "Rules": "drift",
    "rule_for": "drift",
    "check_drift": "drift",
    "log_drift": "drift",
    "CheckpointSaveError": "save",
    "save_checkpoint": "save",
    "prune": "retention",
    "make_room": "retention",
    "free_bytes": "retention",
    "checkpoint_bytes": "retention",
    "last_checkpoint_bytes": "retention",
    "UNIVERSAL_CHECKPOINT_INFO": "load",
    "load_checkpoint": "load",
    "to_universal": "load",
    "CheckpointManager": "manager",
    "every": "manager",
}


def __getattr__(name: str) -> Any:
    """Resolve a public name from its module on first use (PEP 562), so importing the package costs nothing."""
    module = _HOME.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(f"{__name__}.{module}"), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(list(globals()) + list(_HOME))


__all__ = sorted(_HOME)
