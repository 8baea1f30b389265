"""`python -m albert_dist.runs.newest`: the one reader of a run's newest checkpoint for the launch scripts
(launch/pretrain_local.sh and slurm/common.sh each had a heredoc of their own)."""
import json

from albert_dist.runs.newest import main, newest, newest_step_dir


def _save(ckpt, tag, **meta):
    (ckpt / tag).mkdir(parents=True)
    (ckpt / tag / "albert_dist.json").write_text(json.dumps(meta))
    (ckpt / "latest").write_text(tag + "\n")


def test_the_newest_complete_checkpoint_one_field_a_line_and_nothing_without_one(tmp_path, capsys):
    run = tmp_path / "run"
    run.mkdir()
    assert newest(run) is None and newest_step_dir(run) == ""
    assert main([str(run)]) == 0 and capsys.readouterr().out == ""
    _save(run / "checkpoints", "step_7", step=7, reason="stop", stop_cause="store", config={"max_steps": 50})
    (run / "checkpoints" / "step_9").mkdir()  # a save cut short: no albert_dist.json, `latest` unchanged
    assert main([str(run)]) == 0
    assert capsys.readouterr().out.splitlines() == [str(run / "checkpoints" / "step_7"), "stop", "7", "50", "store"]
    assert main([str(run), "--any"]) == 0 and capsys.readouterr().out == "step_9\n"
    _save(run / "checkpoints", "step_10", step=10, reason="interval")  # a field it lacks is an empty line
    assert newest(run) == [str(run / "checkpoints" / "step_10"), "interval", "10", "", ""]


def test_checkpoint_dir_of_the_runs_config_is_followed_and_bad_usage_is_exit_2(tmp_path, capsys):
    run, elsewhere = tmp_path / "run", tmp_path / "ckpts"
    run.mkdir()
    (run / "config.yaml").write_text(f"checkpoint:\n  dir: {elsewhere}\n")
    _save(elsewhere, "step_3", step=3, reason="final", config={"max_steps": 3})
    assert newest(run)[:3] == [str(elsewhere / "step_3"), "final", "3"]
    assert main([str(run), "--all"]) == 2 and "usage" in capsys.readouterr().err
