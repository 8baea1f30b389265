"""The bench's study scripts: bench/downstream/sharing_study.py's flags in one string (`--args`, what
slurm/sharing_study.sbatch passes) and cell check; and every study's record written under its --out, into the
repository's bench/results only when a flag says so."""
from __future__ import annotations

import argparse
import json
import shutil

import pytest

from albert_dist.config import load_config, to_yaml
from tests.helpers import REPO, load_bench

S = load_bench("downstream/sharing_study")
STUDY_ARGS = "--steps 10 --finetune-args '--max-train-samples 200 --epochs 1' data.eval_examples=100"


def test_a_quoted_value_in_args_stays_one_flag_value_and_reaches_the_cell_and_its_fine_tune(tmp_path, monkeypatch,
                                                                                            capsys):
    """ALBERT_STUDY_ARGS was word-split by the batch shell: a quoted --finetune-args could not pass, and the
    study's `overrides` exited 2 unseen. Now the string is split as a shell would (shlex) by the study itself."""
    assert S.main(["overrides", "--modes", "ffn", f"--args={STUDY_ARGS}"]) == 0
    overrides = capsys.readouterr().out.splitlines()
    assert {"model.sharing=ffn", "max_steps=10", "data.eval_examples=100"} <= set(overrides)
    commands = []
    monkeypatch.setattr(S.subprocess, "run", lambda cmd, **kw: commands.append(cmd))
    assert S.main(["finetune", "--modes", "ffn", "--out", str(tmp_path), "--glue-dir", "g", f"--args={STUDY_ARGS}"]) == 0
    (cmd,) = commands
    assert cmd[-4:] == ["--max-train-samples", "200", "--epochs", "1"]


@pytest.mark.parametrize("args, says", [("--stepz 10", "unrecognized arguments: --stepz 10"),
                                        ("--finetune-args '--epochs 1", "No closing quotation"),
                                        ("--modes all", "--modes, --out and --args are the caller's")])
def test_flags_that_do_not_parse_are_exit_2(args, says, capsys):
    with pytest.raises(SystemExit) as exc:
        S.main(["overrides", "--modes", "ffn", f"--args={args}"])
    assert exc.value.code == 2 and says in capsys.readouterr().err


def _cell(tmp_path, mode, overrides):
    """A cell's run directory as a training run leaves it: the resolved config in config.yaml."""
    cell = tmp_path / mode
    cell.mkdir()
    (cell / "config.yaml").write_text(to_yaml(load_config(S.RECIPE, overrides)))
    (cell / "metrics.jsonl").write_text(json.dumps({"step": 10, "val/mlm_accuracy": 0.25}) + "\n")
    return cell


def test_a_cell_whose_run_is_another_model_fails_its_check(tmp_path, capsys):
    """The issue's study: every array task trained the recipe's default (sharing: all, 1,000 steps) under its
    cell's name. The check compares the run's resolved config with what the cell asked for."""
    args = ["check", "--modes", "ffn", "--out", str(tmp_path), "--args=--steps 10"]
    _cell(tmp_path, "ffn", ["max_steps=10"])  # the cell's sharing override lost
    assert S.main(args) == 1
    err = capsys.readouterr().err
    assert "model.sharing is 'all', the cell asked for 'ffn'" in err and "num_hidden_layers" in err, err
    (tmp_path / "ffn/config.yaml").unlink()
    assert S.main(args) == 1 and "no config.yaml" in capsys.readouterr().err
    shutil.rmtree(tmp_path / "ffn")
    asked = S.cell_overrides(argparse.Namespace(layers=6, hidden=128, embedding=64, intermediate=512, heads=4,
                                                steps=10, experiment="sharing-study", overrides=[]), "ffn")
    _cell(tmp_path, "ffn", asked)
    assert S.main(args) == 0
    assert json.loads((tmp_path / "ffn/study_cell.json").read_text())["overrides"] == asked


def test_the_report_writes_under_out_and_into_bench_results_only_when_asked(tmp_path, monkeypatch):
    """`report --out X` rewrote the committed bench/results/sharing_study.{json,png} with a one-cell table."""
    monkeypatch.setattr(S, "RESULTS", tmp_path / "repo-results", raising=False)  # where the old code wrote
    _cell(tmp_path, "attention", ["model.sharing=attention"])
    assert S.main(["report", "--modes", "attention", "--out", str(tmp_path)]) == 0
    assert json.loads((tmp_path / "sharing_study.json").read_text())["cells"][0]["sharing"] == "attention"
    assert (tmp_path / "sharing_study.png").stat().st_size > 0 and not (tmp_path / "repo-results").exists()
    assert S.main(["report", "--modes", "attention", "--out", str(tmp_path), "--results", str(tmp_path / "r")]) == 0
    assert (tmp_path / "r/sharing_study.json").is_file() and (REPO / "bench/results/sharing_study.json").is_file()


def test_what_pretraining_buys_writes_its_record_under_out_unless_told(tmp_path, monkeypatch):
    """Like the study's report, it wrote bench/results/what_pretraining_buys.json whatever --out said."""
    W = load_bench("downstream/what_pretraining_buys")
    monkeypatch.setattr(W, "ROOT", tmp_path / "repo")  # where the old code wrote: <ROOT>/bench/results
    result = {"task": "sst2", "primary_metric": "accuracy", "seeds": {"1": {"accuracy": 0.8}, "2": {"accuracy": 0.9}},
              "finetune": {"learning_rate": 1e-3, "num_train_epochs": 1, "per_device_train_batch_size": 32,
                           "max_seq_length": 64}, "train_examples": 200, "model": "m"}
    for folder, init in ((tmp_path / "run", "pretrained"), (tmp_path / "out/random", "random")):
        folder.mkdir(parents=True)
        (folder / "downstream.json").write_text(json.dumps({"results": [{**result, "init": init}]}))
    args = ["--run", str(tmp_path / "run"), "--glue-dir", "g", "--tasks", "sst2", "--out", str(tmp_path / "out"),
            "--report-only"]
    assert W.main(args) == 0
    record = json.loads((tmp_path / "out/what_pretraining_buys.json").read_text())
    assert record["ours (random init)"]["sst2"]["seeds"] == result["seeds"] and not (tmp_path / "repo").exists()
    assert W.main([*args, "--results", str(tmp_path / "published")]) == 0
    assert (tmp_path / "published/what_pretraining_buys.json").is_file() and not (tmp_path / "repo").exists()


def test_object_cache_writes_into_bench_results_only_with_write_doc(tmp_path, monkeypatch):
    O = load_bench("object_cache")
    monkeypatch.setattr(O, "BENCH_DIR", tmp_path / "bench")  # where it writes its committed record
    (tmp_path / "bench/results").mkdir(parents=True)
    monkeypatch.setattr(O, "run", lambda mb: {"mb": mb})  # the measurement (a moto server) is not what is tested
    monkeypatch.setattr(O, "table", lambda result: "| table |")
    monkeypatch.setattr("sys.argv", ["object_cache.py", "--json", str(tmp_path / "mine.json")])
    O.main()
    assert json.loads((tmp_path / "mine.json").read_text()) == {"mb": 16}
    assert list((tmp_path / "bench/results").iterdir()) == []
    import _common  # bench/_common.py, on sys.path through load_bench

    monkeypatch.setattr(_common, "write_block", lambda *a: None)
    monkeypatch.setattr("sys.argv", ["object_cache.py", "--write-doc"])
    O.main()
    assert json.loads((tmp_path / "bench/results/object_cache.json").read_text()) == {"mb": 16}
