"""Checkpoints through the DeepSpeed engine, with the training state DeepSpeed does not know about.

`CheckpointManager` is the one place that decides about checkpoints: its `resume()` is the job's one resume
call (fetching an MLflow run's checkpoint first when asked; building the engine with the DeepSpeed-config
overrides the resume needs; loading the engine, the data loaders and, last, the RNGs), and `maybe_save()`
saves on the loop's cadence and applies retention. The resume itself is planned once, before any process group
(`plan_load`). This file holds no code: import the module that defines a name (`from
albert_dist.engine.checkpoint.choose import newest_verified`), so a reader follows every name to its home:

    layout.py     tags, `latest`, `albert_dist.json`, verification (torch-free: tracking uses it too)
    state.py      TrainState (what DeepSpeed does not save), RNG states and seeds
    choose.py     which checkpoint to resume from: VerifiedCheckpoint, newest_verified, choose_checkpoint (no
                  process group needed)
    drift.py      what a config change means on resume
    resume.py     how to load it: LoadPlan, plan_load (the checkpoint + what the config changes mean there, made
                  before the process group), Resumed, rng_kept
    save.py       the collective save protocol;  retention.py  which checkpoints are kept
    load.py       universal conversion, engine load, the current config's lr and optimiser hyper-parameters
    manager.py    CheckpointManager
    reshard.py    the data streams' continuation on another number of ranks

Layout of `<checkpoint dir>` (default `<run_dir>/checkpoints`)::

    step_<N>/                 one DeepSpeed checkpoint (engine.save_checkpoint(tag="step_<N>")), + albert_dist.json
    step_<N>_universal/       the same converted by DeepSpeed's ds_to_universal, made when resuming elsewhere
    latest                    the tag of the newest *verified* checkpoint (DeepSpeed's format: the tag, no newline)

`albert_dist.json` (`META_FILE`) = {"format", "step", "world_size", "zero_stage", "config_hash", "reason" (why it
was written: "interval", "final" or "stop", the last for a stop's, with "stop_cause": "signal", "store" or "input", an object
store that stayed unavailable), "config" (the
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

Resume (`choose_checkpoint`, no process group needed): "auto" takes the newest `step_<N>` directory that verifies,
logging each newer one it skips and why (whatever `latest` says: a `latest` naming a missing step falls back
the same way). Retention (`prune`) never deletes the newest verified checkpoint, nor the one the job resumed
from until a newer verified one exists; unverified directories are removed. It also runs when a job resumes, so
a lowered `checkpoint.keep_last` frees its space before the first save.

Resume on another number of ranks (the saved world size differs), or with a changed field whose resume rule is
"convert" (a ZeRO partition-layout option, `albert_dist.on_resume`; `LoadPlan.universal`): rank 0 converts the checkpoint with
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
