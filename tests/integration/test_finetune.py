"""`albert-dist finetune` end to end on CPU (in process, transformers' Trainer): a tiny run directory pretrained
here on a learnable synthetic language, GLUE-format files written here, a real local MLflow store (SQLite).

* a classification and a regression task, 2 seeds: downstream.json, the printed table, the child runs and
  the medians on the pretraining run (read back with `MlflowClient`), and `albert-dist compare` showing them;
* the same weights reached as a run's checkpoint (--step), an MLflow run id (its checkpoint artifact, or its
  final-model artifact) and a transformers directory score exactly as the run's final model;
* pretraining pays: fine-tuned on a few labelled words, the pretrained encoder generalises to unseen words,
  random init (--init random, a standalone run) does not.
"""
from __future__ import annotations

import json
import math
import statistics

import pytest
import torch

from albert_dist.cli import main as cli_main
from albert_dist.runs.weights import load_state_dict
from fixtures.finetune_run import (STEPS_DONE, WORDS_PER_CLASS, make_run_dir, make_tokenizer, write_sst2,
                                   write_stsb)

pytestmark = pytest.mark.integration
mlflow = pytest.importorskip("mlflow")
pytest.importorskip("transformers")

PRETRAIN_STEPS = 150
FAST = ["--epochs", "2", "--learning-rate", "1e-3"]


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    """Tokenizer, a pretrained run tracked in a SQLite store (with a retained checkpoint uploaded as --resume-from
    expects it), GLUE-format sst2/stsb directories."""
    from mlflow import MlflowClient
    from mlflow.entities import Metric

    root = tmp_path_factory.mktemp("finetune")
    uri = f"sqlite:///{root / 'mlruns.db'}"
    client = MlflowClient(uri)
    experiment = client.create_experiment("pretrain", artifact_location=(root / "artifacts").as_uri())
    parent = client.create_run(experiment, tags={"mlflow.runName": "tiny-pretrain"}).info.run_id
    client.log_batch(parent, metrics=[Metric("train/loss", 3.0 - s / 10, 0, s) for s in range(1, STEPS_DONE + 1)])
    client.set_terminated(parent)
    run = make_run_dir(root / "run", make_tokenizer(root / "tok"), PRETRAIN_STEPS, run_id=parent, tracking_uri=uri)
    _write_checkpoint(run, client, parent)
    write_sst2(root / "glue" / "sst2", 48, 64)
    write_stsb(root / "glue" / "stsb", 48, 48)
    # few labelled words in train, others in dev: only an encoder that learned the word classes generalises
    write_sst2(root / "few" / "sst2", 24, 80, train_words=range(0, 3), dev_words=range(6, WORDS_PER_CLASS), seed=1)
    return {"root": root, "uri": uri, "client": client, "parent": parent, "run": run, "experiment": experiment}


def _write_checkpoint(run, client, run_id):
    """The final model as a ZeRO-0 DeepSpeed checkpoint ``checkpoints/step_<STEPS_DONE>`` of the run (module states
    + albert_dist.json with the resolved config), and the same uploaded as the run's checkpoint artifact with its
    COMPLETE.json marker (albert_dist.tracking.checkpoints' layout)."""
    import yaml

    tag = run / "checkpoints" / f"step_{STEPS_DONE}"
    tag.mkdir(parents=True)
    torch.save({"module": load_state_dict(run / "final_model" / "fp32")}, tag / "mp_rank_00_model_states.pt")
    config = yaml.safe_load((run / "config.yaml").read_text())
    (tag / "albert_dist.json").write_text(json.dumps({"step": STEPS_DONE, "world_size": 1, "zero_stage": 0,
                                                      "config_hash": "test", "config": config}))
    marker = {"step": STEPS_DONE, "tag": tag.name, "files": {p.name: p.stat().st_size for p in tag.iterdir()}}
    client.log_artifacts(run_id, str(tag), f"checkpoints/{tag.name}")
    (run / "COMPLETE.json").write_text(json.dumps(marker))
    client.log_artifact(run_id, str(run / "COMPLETE.json"), f"checkpoints/{tag.name}")


def _results(path):
    return {(e["task"], e["init"], e["model"]): e for e in json.loads(path.read_text())["results"]}


def test_scores_a_run_on_classification_and_regression_into_mlflow(world, capsys):
    run, client, parent = world["run"], world["client"], world["parent"]
    code = cli_main(["finetune", str(run), "--task", "sst2", "stsb", "--data-dir", str(world["root"] / "glue"),
                         "--seeds", "1", "2", *FAST])
    out = capsys.readouterr().out
    assert code == 0
    results = [e for e in json.loads((run / "downstream.json").read_text())["results"] if e["init"] == "pretrained"]
    assert [e["task"] for e in results] == ["sst2", "stsb"]
    for entry in results:
        assert entry["step"] == STEPS_DONE and set(entry["seeds"]) == {"1", "2"}
        for metric, summary in entry["summary"].items():
            values = [s[metric] for s in entry["seeds"].values()]
            assert summary == {"median": statistics.median(values), "min": min(values), "max": max(values)}
            assert f"{entry['task']:<4}  {metric}" in out
    assert set(results[1]["summary"]) == {"pearson", "spearmanr"}

    children = client.search_runs([world["experiment"]], f"tags.mlflow.parentRunId = '{parent}'")
    assert len(children) == 4
    for child in children:
        p = child.data.params
        entry = results[0] if p["task"] == "sst2" else results[1]
        assert (p["init"], p["checkpoint_step"], float(p["lr"]), p["max_len"]) == ("pretrained", str(STEPS_DONE),
                                                                                   1e-3, "32")
        for metric, value in entry["seeds"][p["seed"]].items():
            assert child.data.metrics[metric] == pytest.approx(value)
        assert child.info.status == "FINISHED"
    for entry in results:
        for metric, summary in entry["summary"].items():
            history = client.get_metric_history(parent, f"downstream/{entry['task']}/{metric}")
            assert [(m.step, m.value) for m in history] == [(STEPS_DONE, pytest.approx(summary["median"]))]

    assert cli_main(["compare", parent, "--tracking-uri", world["uri"], "--metrics", "loss",
                        "--output", str(world["root"] / "c.png")]) == 0
    table = capsys.readouterr().out
    assert "downstream/sst2/accuracy.final" in table and "downstream/stsb/pearson.best" in table
    assert cli_main(["compare", "--experiment", "pretrain", "--tracking-uri", world["uri"], "--metrics", "loss",
                        "--output", str(world["root"] / "c.png")]) == 0
    table = capsys.readouterr().out.splitlines()
    run_ids = next(line for line in table if line.startswith("run_id"))
    assert run_ids.split()[1:] == [parent]  # the fine-tunes are children, not runs to compare
    assert not any(line.startswith(("train_runtime_s", "seed")) for line in table)  # nor their metrics, params


def test_checkpoint_mlflow_run_and_transformers_dir_score_as_the_final_model(world, capsys):
    run, root = world["run"], world["root"]
    common = ["--task", "sst2", "--data-dir", str(root / "glue" / "sst2"), "--seeds", "3", *FAST]
    assert cli_main(["finetune", str(run), *common, "--no-tracking", "--output", str(root / "final")]) == 0
    assert cli_main(["finetune", str(run), "--step", str(STEPS_DONE), *common, "--no-tracking",
                         "--output", str(root / "step")]) == 0
    assert cli_main(["finetune", world["parent"], "--tracking-uri", world["uri"], *common, "--no-tracking",
                         "--output", str(root / "byid")]) == 0
    assert cli_main(["finetune", str(run / "final_model" / "hf"), *common, "--no-tracking", "--output", str(root / "hf")]) == 0
    # a run with no checkpoint artifact, only its logged final model and tokenizer (as log_model leaves it)
    client = world["client"]
    final_only = client.create_run(world["experiment"]).info.run_id
    client.log_artifacts(final_only, str(run / "final_model" / "fp32"), "model/fp32")
    client.log_artifact(final_only, str(root / "tok" / "spiece.model"), "tokenizer")
    client.log_param(final_only, "max_steps", STEPS_DONE)
    assert cli_main(["finetune", final_only, "--tracking-uri", world["uri"], *common, "--no-tracking",
                         "--output", str(root / "final_only")]) == 0
    capsys.readouterr()
    scores = {name: next(iter(_results(root / name / "downstream.json").values())) for name in
              ("final", "step", "byid", "hf", "final_only")}
    reference = scores["final"]["seeds"]["3"]
    for name, entry in scores.items():
        got = entry["seeds"]["3"]
        assert got["accuracy"] == reference["accuracy"] and got["train_loss"] == pytest.approx(
            reference["train_loss"], rel=1e-5), name
    assert scores["byid"]["step"] == scores["final_only"]["step"] == STEPS_DONE and scores["hf"]["step"] is None
    assert scores["final_only"]["model"] == f"runs:/{final_only} (final model)"
    # the run's directory and its run id are one model: one downstream.json entry when both score into one file
    assert scores["final"]["model_identity"] == scores["byid"]["model_identity"] == f"mlflow:{world['parent']}"
    assert scores["hf"]["model_identity"] == f"path:{(run / 'final_model' / 'hf').resolve()}"


def test_pretrained_encoder_beats_random_init_on_unseen_words(world, capsys):
    run, client = world["run"], world["client"]
    few = ["--task", "sst2", "--data-dir", str(world["root"] / "few" / "sst2"), "--seeds", "1", "2", "3",
           "--epochs", "8", "--learning-rate", "1e-3", "--classifier-dropout", "0"]
    assert cli_main(["finetune", str(run), *few]) == 0
    assert cli_main(["finetune", str(run), *few, "--init", "random", "--experiment", "floors"]) == 0
    capsys.readouterr()
    entries = [e for e in json.loads((run / "downstream.json").read_text())["results"]
               if e["data"].endswith("few/sst2")]
    acc = {e["init"]: [s["accuracy"] for s in e["seeds"].values()] for e in entries}
    # unseen words: random init sits near chance, the pretrained encoder far above it, on every seed
    assert min(acc["pretrained"]) > max(acc["random"]), acc
    assert statistics.median(acc["pretrained"]) - statistics.median(acc["random"]) > 0.2, acc

    floors = client.get_experiment_by_name("floors")
    standalone = client.search_runs([floors.experiment_id], "tags.mlflow.runName = 'run-random'")
    assert len(standalone) == 1 and standalone[0].data.tags["pretraining_run_id"] == world["parent"]
    assert standalone[0].data.params == {**client.get_run(world["parent"]).data.params, "init": "random"}
    assert standalone[0].data.metrics["downstream/sst2/accuracy"] == pytest.approx(statistics.median(acc["random"]))
    children = client.search_runs([floors.experiment_id],
                                  f"tags.mlflow.parentRunId = '{standalone[0].info.run_id}'")
    assert sorted(c.data.params["seed"] for c in children) == ["1", "2", "3"]


def test_partial_sharing_run_fine_tunes(world, capsys):
    """The sharing study fine-tunes every mode; transformers holds only `all`, so no hf/ is exported and the
    fp32 final model is what `finetune` reads."""
    run = make_run_dir(world["root"] / "run-ffn", world["root"] / "tok" / "spiece.model", 20, sharing="ffn")
    assert not (run / "final_model" / "hf").exists()
    assert cli_main(["finetune", str(run), "--task", "sst2", "--data-dir", str(world["root"] / "glue" / "sst2"),
                         "--seeds", "1", "--no-tracking", *FAST]) == 0
    capsys.readouterr()
    (entry,) = json.loads((run / "downstream.json").read_text())["results"]
    assert entry["source"]["config"]["sharing"] == "ffn" and entry["step"] == STEPS_DONE
    assert 0.0 <= entry["seeds"]["1"]["accuracy"] <= 1.0 and math.isfinite(entry["seeds"]["1"]["train_loss"])


def test_results_file_keeps_concurrent_writers_entries_and_replaces_reruns(tmp_path):
    """downstream.json: entries of other tasks/steps kept, a rerun of the same fine-tunes replaced; processes
    writing at once (a task each) lose nothing."""
    import multiprocessing

    from albert_dist.apps.finetune.run import write_results

    path = tmp_path / "downstream.json"
    base = {"init": "pretrained", "model": "m", "step": 1, "finetune": {"lr": 1}, "train_examples": 8,
            "dev_examples": 8}
    ctx = multiprocessing.get_context("fork")
    procs = [ctx.Process(target=write_results, args=(path, {**base, "task": f"t{i}", "v": i})) for i in range(6)]
    for p in procs:
        p.start()
    for p in procs:
        p.join()
    write_results(path, {**base, "task": "t0", "v": "again"})
    results = json.loads(path.read_text())["results"]
    assert sorted(r["task"] for r in results) == [f"t{i}" for i in range(6)]
    assert next(r for r in results if r["task"] == "t0")["v"] == "again"


def test_ctrl_c_is_one_line_exit_130_and_leaves_no_lock(tmp_path):
    """SIGINT during the second task's training: exit 130 with one line (was a 25-line KeyboardInterrupt
    traceback), the finished task's entry kept, no lock or temporary file beside downstream.json. A subprocess:
    the signal must reach a real interpreter; the model is untrained, the first task 8 examples."""
    import signal
    import subprocess
    import sys
    import time

    from helpers import REPO, clean_env

    run = make_run_dir(tmp_path / "run", make_tokenizer(tmp_path / "tok"))
    write_sst2(tmp_path / "glue" / "sst2", 8, 8)
    write_stsb(tmp_path / "glue" / "stsb", 2000, 8)  # 6,250 steps at 50 epochs: still training at the signal
    with open(tmp_path / "stderr", "w+") as err:
        proc = subprocess.Popen([sys.executable, "-m", "albert_dist.cli", "finetune", str(run), "--task", "sst2",
                                 "stsb", "--data-dir", str(tmp_path / "glue"), "--seeds", "1", "--epochs", "50",
                                 "--no-tracking"], cwd=REPO, env=clean_env(TQDM_DISABLE="1"), stderr=err,
                                # SIGINT at its default, as in a terminal: tests started as a script's background
                                # job (`bash .ci/run &`) inherit it ignored, and Python keeps an ignored SIGINT so:
                                # no KeyboardInterrupt, the fine-tune ran to its end and exited 0 (two CI runs)
                                preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
        # generous: the loop ends when sst2's entry is written (~40 s alone; CI's 2 cores under load are far
        # slower), and a signal sent before it is written would fail the test for another reason
        deadline = time.monotonic() + 1200
        while not (run / "downstream.json").exists() and proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.2)  # sst2's entry written: stsb is training
        if proc.poll() is not None or not (run / "downstream.json").exists():
            proc.kill()
            pytest.fail(f"sst2's entry was not written (exit {proc.poll()}): {(tmp_path / 'stderr').read_text()}")
        before = (tmp_path / "stderr").stat().st_size
        proc.send_signal(signal.SIGINT)
        try:  # ~1 s
            code = proc.wait(timeout=120)
        except subprocess.TimeoutExpired:
            proc.kill()
            pytest.fail(f"no exit within 120 s of SIGINT; stderr: {(tmp_path / 'stderr').read_text()[-3000:]}")
    said = (tmp_path / "stderr").read_text()
    assert code == 130, said
    assert said[before:].strip().splitlines() == [
        f"albert-dist finetune: interrupted (Ctrl-C); sst2 finished, in {run / 'downstream.json'}"], said
    assert [e["task"] for e in json.loads((run / "downstream.json").read_text())["results"]] == ["sst2"]
    assert sorted(p.name for p in run.iterdir() if p.name.startswith("downstream")) == ["downstream.json"]
