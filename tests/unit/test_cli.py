"""The `albert-dist` dispatcher: sub-commands, usage errors, launcher-injected --local_rank."""
import pytest

from albert_dist import cli


def test_unknown_command_is_usage_error(capsys):
    assert cli.main(["nope"]) == 2
    assert "unknown command 'nope'" in capsys.readouterr().err


def test_no_command_prints_usage(capsys):
    assert cli.main([]) == 2
    assert "commands:" in capsys.readouterr().out


@pytest.mark.parametrize("prefix", [["--local_rank=1"], ["--local-rank", "1"]])
def test_deepspeed_local_rank_before_subcommand_is_consumed(prefix, monkeypatch):
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
