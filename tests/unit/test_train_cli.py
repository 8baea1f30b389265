"""`albert-dist train` refuses bad inputs with exit code 2 and one line naming the field, before any process group."""
import re
from datetime import datetime, timezone
from pathlib import Path

import pytest

from albert_dist import cli
from albert_dist.apps.pretrain import preflight
from albert_dist.apps.pretrain import main as trainer
from albert_dist.distributed import group as distributed
from albert_dist.distributed.env import DistEnv
from albert_dist.job.lock import RunDirBusy, RunDirLock
from albert_dist.job import lock as run_lock

REPO = Path(__file__).resolve().parents[2]
RECIPE = str(REPO / "configs/pretrain/albert-tiny-wikitext.yaml")
BASE = ["tracking.enabled=false", "max_steps=40"]


@pytest.fixture(autouse=True)
def no_process_group(monkeypatch):
    for var in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "SLURM_PROCID", "SLURM_NTASKS"):
        monkeypatch.delenv(var, raising=False)

    def fail(*args, **kwargs):
        raise AssertionError("a bad config must be refused before the process group starts")

    monkeypatch.setattr(distributed, "init_distributed", fail)
    monkeypatch.setattr(trainer.Trainer, "setup", lambda self: pytest.fail("Trainer.setup reached"))


@pytest.mark.parametrize("args, fragments", [
    (["data.train=[{paths: [/nonexistent/*.txt]}]"], ["data.train[0].paths", "/nonexistent/*.txt", "matches no file"]),
    (["data.validation=[{paths: [/nonexistent.txt]}]"], ["data.validation[0].paths", "/nonexistent.txt"]),
    (["data.tokenizer_path=/nope/spiece.model"], ["tokenizer_path", "/nope/spiece.model"]),
    (["model.vocab_size=100"], ["model.vocab_size (100)", "8000"]),
    (["data.max_seq_length=256"], ["data.max_seq_length (256)", "model.max_position_embeddings (128)"]),
    (["--resume", "/nonexistent/ckpt"], ["checkpoint.resume", "/nonexistent/ckpt"]),
    (["--resume", "auto"], ["--resume auto", "run_dir"]),
    (["--resume-from", "deadbeef"], ["--resume-from", "deadbeef"]),
    (["engine.gradient_accumulation_steps=auto", "engine.train_batch_size=9"],
     ["engine.gradient_accumulation_steps=auto", "engine.train_batch_size (9)", "world size (1) = 16"]),
])
def test_bad_input_is_exit_2_naming_field_and_value(args, fragments, capsys):
    assert cli.main(["train", "--config", RECIPE, *BASE, *args]) == trainer.EXIT_CONFIG_ERROR
    err = capsys.readouterr().err
    assert err.startswith("albert-dist train: ") and "Traceback" not in err
    for fragment in fragments:
        assert fragment in err, (fragment, err)


def test_good_inputs_pass_the_preflight_and_reach_the_trainer(tmp_path, monkeypatch, capsys):
    """The same command line without the bad value: every check passes and the trainer is set up with the config."""
    reached = []
    def setup(self):  # stands in for the build: record the config, name the run directory as setup does
        reached.append(self.cfg)
        self.run_dir = Path(self.cfg.run_dir)

    monkeypatch.setattr(trainer.Trainer, "setup", setup)
    monkeypatch.setattr(trainer.Trainer, "train", lambda self: trainer.EXIT_OK)
    monkeypatch.setattr(trainer.Trainer, "export_trained_model", lambda self: None)
    assert cli.main(["train", "--config", RECIPE, *BASE, f"run_dir={tmp_path}"]) == trainer.EXIT_OK
    assert [(cfg.max_steps, cfg.run_dir, cfg.tracking.enabled) for cfg in reached] == [(40, str(tmp_path), False)]
    assert "albert-dist train:" not in capsys.readouterr().err


def test_the_job_discovers_its_place_and_resolves_its_world_size_view_once(tmp_path, monkeypatch):
    """One discovery of the rank's place (the app's main) and one resolution of ``gradient_accumulation_steps:
    auto`` (the preflight): the Trainer and the DeepSpeed config take both from the preflight's JobPlan. Every
    module that did either is watched (before: 2 discoveries, main's and the Trainer's, and 6 resolutions: the
    preflight twice, the batch check, the DeepSpeed config builder twice, the Trainer)."""
    from albert_dist.apps.pretrain import trainer as trainer_module
    from albert_dist.config import load as config_load
    from albert_dist.distributed import env as dist_env
    from albert_dist.engine import config as engine_config
    from albert_dist.engine import deepspeed_config

    calls = {"discover": [], "resolve": []}

    def counted(name, function):
        def call(*args, **kwargs):
            result = function(*args, **kwargs)
            calls[name].append(result)
            return result
        return call

    for module in (trainer, trainer_module, distributed):
        monkeypatch.setattr(module, "discover", counted("discover", dist_env.discover), raising=False)
    for module in (config_load, engine_config, deepspeed_config):
        monkeypatch.setattr(module, "resolve_accumulation", counted("resolve", engine_config.resolve_accumulation),
                            raising=False)
    seen = []

    def setup(self):
        seen.append((self.cfg, self.dist_env, self.ds_config))
        self.run_dir = Path(self.cfg.run_dir)

    monkeypatch.setattr(trainer.Trainer, "setup", setup)
    monkeypatch.setattr(trainer.Trainer, "train", lambda self: trainer.EXIT_OK)
    monkeypatch.setattr(trainer.Trainer, "export_trained_model", lambda self: None)
    overrides = [*BASE, f"run_dir={tmp_path}", "engine.gradient_accumulation_steps=auto",
                 "engine.train_micro_batch_size_per_gpu=4", "engine.train_batch_size=12"]
    assert trainer.main(RECIPE, overrides) == trainer.EXIT_OK
    ((cfg, env, ds_config),) = seen
    assert [len(calls["discover"]), len(calls["resolve"])] == [1, 1], calls
    assert env is calls["discover"][0] and cfg.engine is calls["resolve"][0]
    assert cfg.engine.gradient_accumulation_steps == ds_config["gradient_accumulation_steps"] == 3  # 12 / (4 x 1)


def test_without_run_dir_the_preflight_names_the_run_directory_and_holds_its_lock_for_the_job(tmp_path, monkeypatch):
    """Rank 0's preflight names runs/<recipe>-<UTC time> (under the working directory) and locks it before the
    process group; the trainer takes that name; the lock is released when the job ends."""
    monkeypatch.chdir(tmp_path)
    seen = []

    def setup(self):
        self.run_dir = Path(self._agree_run_dir())
        with pytest.raises(RunDirBusy):  # held by the job (a second open file is refused, as another job's)
            RunDirLock(self.run_dir).acquire()
        seen.append(self.run_dir)

    monkeypatch.setattr(trainer.Trainer, "setup", setup)
    monkeypatch.setattr(trainer.Trainer, "train", lambda self: trainer.EXIT_OK)
    monkeypatch.setattr(trainer.Trainer, "export_trained_model", lambda self: None)
    assert cli.main(["train", "--config", RECIPE, *BASE]) == trainer.EXIT_OK
    (run_dir,) = seen
    assert run_dir.parent == tmp_path / "runs" and run_dir.name.startswith("albert-tiny-wikitext-20")
    RunDirLock(run_dir).acquire().release()  # free again


def test_two_jobs_named_in_the_same_second_get_two_directories(tmp_path, monkeypatch):
    noon = datetime(2026, 1, 1, 12, 0, 0, tzinfo=timezone.utc)
    monkeypatch.setattr(run_lock, "datetime", type("Frozen", (), {"now": staticmethod(lambda tz=None: noon)}))
    first = preflight.lock_auto_run_dir("tiny", tmp_path / "runs")
    second = preflight.lock_auto_run_dir("tiny", tmp_path / "runs")
    assert [first.run_dir.name, second.run_dir.name] == ["tiny-20260101-120000", "tiny-20260101-120000-2"]
    first.release()
    second.release()


def test_an_automatic_name_reserved_by_the_launch_script_is_not_taken(tmp_path, monkeypatch):
    """launch/pretrain_local.sh reserves runs/<recipe>-<time> with mkdir and its ranks lock it only when they
    start; a plain `albert-dist train` in that second took the unlocked directory, and the script's run was then
    refused as a second job in it."""
    noon = datetime(2026, 1, 1, 12, 0, 0, tzinfo=timezone.utc)
    monkeypatch.setattr(run_lock, "datetime", type("Frozen", (), {"now": staticmethod(lambda tz=None: noon)}))
    (tmp_path / "runs/tiny-20260101-120000").mkdir(parents=True)  # the script's reservation
    lock = preflight.lock_auto_run_dir("tiny", tmp_path / "runs")
    assert lock.run_dir.name == "tiny-20260101-120000-2"
    lock.release()


def test_a_recipe_path_is_found_from_any_directory_as_data_paths_are(tmp_path, monkeypatch):
    """`--config configs/pretrain/<recipe>.yaml` from outside the checkout said "config file not found" although
    the recipe's own data paths are found relative to the repository root; now the recipe is found the same way,
    and a missing one names both places looked at."""
    from albert_dist.config import load_config

    monkeypatch.chdir(tmp_path)
    cfg = load_config("configs/pretrain/albert-tiny-wikitext.yaml", ["max_steps=3"])
    assert cfg.max_steps == 3 and cfg.model.hidden_size == load_config(RECIPE).model.hidden_size
    with pytest.raises(FileNotFoundError, match=r"config file not found: configs/nope\.yaml \(looked for "
                                                + re.escape(str(tmp_path / "configs/nope.yaml")) + " and "):
        load_config("configs/nope.yaml")


@pytest.mark.parametrize("rank, own_error, prints", [
    (0, True, "albert-dist train: override 'max_steps=oops'"),  # rank 0's own refusal: the job's line
    (1, True, None),  # every rank refuses the same config: only rank 0 says so
    (0, False, "albert-dist train: rank 1: data.train: only rank 1 sees this"),  # rank 0 prints another's verdict
])
def test_a_refused_multi_rank_job_prints_its_line_once_on_rank_0(rank, own_error, prints, monkeypatch, capsys):
    """A config error through a launcher was printed by every rank (64 ranks: 64 lines). Each rank of a 2-rank
    job is played here in turn, the rendezvous store stood in for: rank 0 prints the job's one line, its own
    refusal or the first other rank's (the store's verdict); the other ranks exit 2 without a word."""
    from albert_dist.distributed.rendezvous import PreflightRefused
    from albert_dist.job.stop import StopFlag

    monkeypatch.setattr(trainer, "discover", lambda: DistEnv(rank, 2, rank, 2, 0, "127.0.0.1", 1, 1, "torchrun"))
    monkeypatch.setattr(trainer, "open_store", lambda env: object())
    monkeypatch.setattr(StopFlag, "retire", StopFlag.restore)  # a test process keeps its signal handlers

    def agree(store, env, error):
        if error is None:
            raise PreflightRefused("rank 1: data.train: only rank 1 sees this")

    monkeypatch.setattr(trainer, "agree", agree)
    if not own_error:
        monkeypatch.setattr(trainer, "preflight", lambda *a, **k: (None, []))
        monkeypatch.setattr(trainer, "Trainer", lambda *a, **k: None)
    overrides = [*BASE, "max_steps=oops"] if own_error else BASE
    assert trainer.main(RECIPE, overrides) == trainer.EXIT_CONFIG_ERROR
    err = capsys.readouterr().err
    lines = [line for line in err.splitlines() if line.startswith("albert-dist train:")]
    assert lines == ([] if prints is None else [next(line for line in lines if line.startswith(prints))]), err
