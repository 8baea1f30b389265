"""The `albert-dist` parser (albert_dist.cli): sub-commands, usage errors, the one error line, launcher-injected
--local_rank, lazy front ends."""

import pytest

from albert_dist import cli


def test_unknown_command_is_usage_error(capsys):
    assert cli.main(["nope"]) == 2
    assert "unknown command 'nope'" in capsys.readouterr().err


def test_no_command_prints_usage(capsys):
    assert cli.main([]) == 2
    err = capsys.readouterr().err
    assert err.startswith("usage: albert-dist") and "a command is required" in err
    assert cli.main(["--help"]) == 0
    out = capsys.readouterr().out
    assert all(name in out for name in cli.COMMANDS), out


def test_train_options_and_overrides_intermix(monkeypatch):
    """`train --config R a=1 --resume auto b=2`: overrides on both sides of an option reach the app's main."""
    import albert_dist.apps.pretrain.main as train_app

    seen = {}
    monkeypatch.setattr(train_app, "main", lambda config, overrides, resume_from: seen.update(
        config=config, overrides=overrides, resume_from=resume_from) or 0)
    monkeypatch.setattr(train_app, "end_process", lambda code: seen.update(ended=code))
    assert cli.main(["train", "--config", "r.yaml", "a.b=1", "--resume", "auto", "c=2"]) == 0
    assert seen == {"config": "r.yaml", "overrides": ["a.b=1", "c=2", "checkpoint.resume=auto"],
                    "resume_from": None, "ended": 0}


def test_a_user_error_is_one_line_and_exit_2(tmp_path, capsys):
    """The one error path: a ValueError/OSError from a front end's work is `error_line`, exit 2."""
    code = cli.main(["tracking", "sync", str(tmp_path)])
    err = capsys.readouterr().err
    assert code == 2 and err == f"albert-dist tracking sync: {tmp_path}: no mlflow_run.json or metrics.jsonl: " \
        "not a run directory\n"
    assert cli.main(["export", str(tmp_path / "nope.pt"), "--output", str(tmp_path / "o")]) == 2
    err = capsys.readouterr().err
    assert err.startswith("albert-dist export: ") and "nope.pt" in err and err.count("\n") == 1


def test_a_missing_option_is_a_usage_error(capsys):
    assert cli.main(["data", "plan", "--ranks", "2"]) == 2
    assert "the following arguments are required: --config" in capsys.readouterr().err



@pytest.mark.parametrize("prefix", [["--local_rank=1"], ["--local-rank", "1"]])
def test_deepspeed_local_rank_before_subcommand_is_consumed(prefix, monkeypatch):
    """Also: a module exposing only `cli(argv)` (a command registered before its front end moved into
    albert_dist.cli) gets the rest of the line, and train's `end_process` runs."""
    seen = {}

    class FakeModule:
        @staticmethod
        def cli(argv):
            seen["argv"] = argv
            return 0

        @staticmethod
        def end_process(code):  # `train` ends a rank of a multi-rank job past its teardown (train.end_process)
            seen["ended"] = code

    # setenv first, so that monkeypatch also removes the LOCAL_RANK the dispatcher sets (later tests start
    # ranks and would read it)
    monkeypatch.setenv("LOCAL_RANK", "unset")
    monkeypatch.delenv("LOCAL_RANK")
    monkeypatch.setattr(cli.importlib, "import_module", lambda name: FakeModule)
    assert cli.main(prefix + ["train", "--config", "x.yaml"]) == 0
    assert seen["argv"] == ["--config", "x.yaml"] and seen["ended"] == 0
    import os

    assert os.environ["LOCAL_RANK"] == "1"
