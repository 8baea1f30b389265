"""`albert-dist finetune` refuses bad input with exit 2 and one line naming it, before any training (nothing
is written). In process: every case stops before the Trainer is built."""
from __future__ import annotations

import shutil
from pathlib import Path

import pytest
import yaml

from albert_dist.cli import main as cli_main
from fixtures.finetune_run import make_run_dir, make_tokenizer, write_glue_tsv, write_sst2

pytest.importorskip("transformers")
SAMPLE_TOKENIZER = Path(__file__).resolve().parents[2] / "data" / "sample" / "spiece.model"  # 8000 pieces


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    root = tmp_path_factory.mktemp("finetune_bad")
    run = make_run_dir(root / "run", make_tokenizer(root / "tok"))
    write_sst2(root / "sst2", 8, 8)
    return root, run


def _bad(capsys, *argv) -> str:
    code = cli_main(["finetune", *argv, "--no-tracking"])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2, err
    assert len(err) == 1 and err[0].startswith("albert-dist finetune: "), err
    return err[0]


def test_unknown_task(world, capsys):
    root, run = world
    assert "unknown task 'sst3'" in _bad(capsys, str(run), "--task", "sst3", "--data-dir", str(root / "sst2"))


def test_missing_column_and_differing_label_sets(world, capsys):
    root, run = world
    write_glue_tsv(root / "f/train.tsv", ["text", "y"], [["a0 a1", "x"], ["b0 b1", "y"]])
    write_glue_tsv(root / "f/dev.tsv", ["text", "y"], [["a0 a1", "x"], ["b0", "z"]])
    files = ["--train-file", str(root / "f/train.tsv"), "--validation-file", str(root / "f/dev.tsv")]
    assert "no column 'sentence' (--text-column)" in _bad(capsys, str(run), *files, "--label-column", "y")
    line = _bad(capsys, str(run), *files, "--text-column", "text", "--label-column", "y")
    assert "label sets differ" in line and "'z'" in line


def test_model_without_tokenizer(world, capsys):
    root, run = world
    hf = root / "hf-no-tokenizer"
    hf.mkdir(exist_ok=True)
    for name in ("config.json", "model.safetensors"):
        shutil.copy(run / "final_model/hf" / name, hf / name)
    line = _bad(capsys, str(hf), "--task", "sst2", "--data-dir", str(root / "sst2"), "--output", str(root / "o"))
    assert "no tokenizer" in line
    no_tok = root / "run-no-tokenizer"
    shutil.copytree(run, no_tok, dirs_exist_ok=True)
    config = yaml.safe_load((no_tok / "config.yaml").read_text())
    config["data"] = {}
    (no_tok / "config.yaml").write_text(yaml.safe_dump(config))
    shutil.rmtree(no_tok / "final_model" / "hf")  # its exported copy would be taken (albert_dist.runs)
    assert "names no tokenizer (data.tokenizer_path)" in _bad(capsys, str(no_tok), "--task", "sst2", "--data-dir",
                                                              str(root / "sst2"))


def test_vocabulary_differs_from_tokenizer(world, capsys):
    root, run = world
    other = root / "run-other-tokenizer"
    shutil.copytree(run, other, dirs_exist_ok=True)
    config = yaml.safe_load((other / "config.yaml").read_text())
    config["data"]["tokenizer_path"] = str(SAMPLE_TOKENIZER)
    (other / "config.yaml").write_text(yaml.safe_dump(config))
    line = _bad(capsys, str(other), "--task", "sst2", "--data-dir", str(root / "sst2"))
    assert "the tokenizer has 8000 pieces but the model's vocab_size is 45" in line


def test_no_such_step_model_or_length(world, capsys):
    root, run = world
    data = ["--task", "sst2", "--data-dir", str(root / "sst2")]
    assert "--step 99: no checkpoint" in _bad(capsys, str(run), "--step", "99", *data)
    assert "not an MLflow run id" in _bad(capsys, str(root / "nowhere"), *data)
    assert "--max-seq-length 64 exceeds the model's max_position_embeddings 32" in _bad(
        capsys, str(run), *data, "--max-seq-length", "64")
    assert not (run / "downstream.json").exists()


def test_bad_hyper_parameters_name_their_flag(world, capsys):
    root, run = world
    data = [str(run), "--task", "sst2", "--data-dir", str(root / "sst2")]
    assert "--learning-rate must be > 0, got -1.0" in _bad(capsys, *data, "--learning-rate", "-1")
    assert "--epochs must be > 0, got 0.0" in _bad(capsys, *data, "--epochs", "0")
    assert "--deepspeed nope.json: no such file" in _bad(capsys, *data, "--deepspeed", "nope.json")
    assert "--seeds has duplicates" in _bad(capsys, *data, "--seeds", "1", "1")


def test_hub_unreachable_asks_for_data_dir(world, capsys, monkeypatch):
    """Without --data-dir GLUE comes from the hub; unreachable (simulated: no network is touched) is exit 2."""
    import datasets

    def offline(*args, **kwargs):
        raise ConnectionError("Couldn't reach 'nyu-mll/glue' on the Hub (LocalEntryNotFoundError)")

    monkeypatch.setattr(datasets, "load_dataset", offline)
    line = _bad(capsys, str(world[1]), "--task", "rte")
    assert "rte: could not load nyu-mll/glue from the hub" in line and "pass --data-dir" in line



def test_a_data_dir_without_the_task_names_the_task_and_the_folders_looked_for(world, capsys):
    """A parent of GLUE task folders that lacks one asked task: exit 2 naming the task and every folder name tried
    (not a `train.tsv` of the parent, which never was a task folder)."""
    root, run = world
    msg = _bad(capsys, str(run), "--task", "sst2", "stsb", "--data-dir", str(root))
    assert "no stsb task in it (looked for stsb/train.tsv, glue-stsb/train.tsv, STS-B/train.tsv)" in msg, msg


def test_run_id_in_a_store_that_does_not_exist(world, capsys, tmp_path):
    """A run id looked up in a missing SQLite store is refused naming the store, and no empty store is left
    behind (MLflow would create one and answer "Run ... not found")."""
    root, _ = world
    store = tmp_path / "moved" / "mlruns.db"
    line = _bad(capsys, "0123456789abcdef0123456789abcdef", "--task", "sst2", "--data-dir", str(root / "sst2"),
                "--tracking-uri", f"sqlite:///{store}", "--output", str(tmp_path / "o"))
    assert f"no MLflow store at {store}" in line and "--tracking-uri" in line
    assert not store.exists() and not store.parent.exists()


def test_a_transformers_directory_without_a_pooler_is_said(world, caplog, tmp_path):
    """run_mlm's AlbertForMaskedLM saves no pooler and no SOP head: they start fresh (as in transformers) and
    the log names them; the run's own full export loads without that warning."""
    import logging

    import transformers

    from albert_dist.apps.finetune.source import from_transformers_dir

    _, run = world
    full = run / "final_model" / "hf"
    with caplog.at_level(logging.WARNING, logger="albert_dist.apps.finetune.source"):
        from_transformers_dir(full).encoder_state()
    assert not [r for r in caplog.records if "random init" in r.getMessage()]
    mlm = tmp_path / "mlm"
    transformers.AlbertForMaskedLM.from_pretrained(full).save_pretrained(mlm)
    for f in full.iterdir():
        if not (mlm / f.name).exists():
            shutil.copy(f, mlm / f.name)
    with caplog.at_level(logging.WARNING, logger="albert_dist.apps.finetune.source"):
        state = from_transformers_dir(mlm).encoder_state()
    said = [r.getMessage() for r in caplog.records if "random init" in r.getMessage()]
    assert len(said) == 1 and "albert.pooler" in said[0] and "sop_classifier" in said[0], said
    assert state  # the encoder still loads


def test_a_task_with_no_usable_rows_names_the_file_and_the_rows_skipped(world, capsys):
    """Another task's folder (CoLA's 4 headerless columns over SST-2's 2), a header-only split and an empty file
    are exit 2 naming the file and the count skipped (they crashed with IndexError in the tokenizer, exit 1)."""
    root, run = world
    line = _bad(capsys, str(run), "--task", "cola", "--data-dir", str(root / "sst2"))
    assert f"{root / 'sst2' / 'train.tsv'}: no usable rows (9 rows skipped: none has the task's 4 tab-separated " \
           "columns (source, label, label_notes, sentence; no header row))" in line, line
    write_sst2(root / "empty-dev", 8, 0)  # a header row only
    line = _bad(capsys, str(run), "--task", "sst2", "--data-dir", str(root / "empty-dev"))
    assert f"{root / 'empty-dev' / 'dev.tsv'}: no usable rows (only a header row)" in line, line
    (root / "empty-dev" / "dev.tsv").write_text("")
    assert f"{root / 'empty-dev' / 'dev.tsv'}: empty file" in _bad(capsys, str(run), "--task", "sst2", "--data-dir",
                                                                  str(root / "empty-dev"))
    write_glue_tsv(root / "ragged/train.tsv", ["text", "label"], [["a0 a1", "0", "extra"], ["b0", "1", "x"]])
    line = _bad(capsys, str(run), "--train-file", str(root / "ragged/train.tsv"), "--validation-file",
                str(root / "ragged/train.tsv"), "--text-column", "text")
    assert "ragged/train.tsv: no usable rows (2 rows skipped: none has the header's 2 fields)" in line, line


def test_a_file_task_whose_name_names_another_task_is_refused(world, capsys, tmp_path):
    """Two file tasks in one folder (a CSV classification, a JSONL regression) both default to the folder's
    name: the second is refused before training instead of replacing the first's results."""
    import json

    from albert_dist.apps.finetune.run import RESULTS_FILE, write_results

    _, run = world
    folder = tmp_path / "reviews"
    folder.mkdir()
    (folder / "train.csv").write_text("text,label\na0 a1,0\nb0 b1,1\n")
    (folder / "train.jsonl").write_text("".join(json.dumps({"text": t, "label": v}) + "\n"
                                                for t, v in (("a0", 0.5), ("b0", 4.5))))
    out = tmp_path / "out"
    csv_task = {"task": "reviews", "task_identity": f"file:{folder / 'train.csv'}", "data": str(folder / "train.csv"),
                "init": "pretrained", "model_identity": "path:/m", "step": 1}
    write_results(out / RESULTS_FILE, csv_task)  # what the CSV task's fine-tune left
    files = ["--train-file", str(folder / "train.jsonl"), "--validation-file", str(folder / "train.jsonl"),
             "--text-column", "text", "--output", str(out)]
    line = _bad(capsys, str(run), *files)
    assert f"task name 'reviews' already names another task in {out / RESULTS_FILE} ({folder / 'train.csv'}); " \
           f"give {folder / 'train.jsonl'} another name with --task-name" in line, line
    # an entry written before task identities were recorded is recognised by its data file
    write_results(out / RESULTS_FILE, {k: v for k, v in csv_task.items() if k != "task_identity"})
    assert "already names another task" in _bad(capsys, str(run), *files)


def test_one_fine_tune_is_one_entry_whatever_named_its_model(tmp_path):
    """A run named by its directory and then by its MLflow run id is one model (`model_identity`): the rerun
    replaces the entry; another step, task or model is kept beside it."""
    import json

    from albert_dist.apps.finetune.run import RESULTS_FILE, write_results

    path = tmp_path / RESULTS_FILE
    base = {"task": "sst2", "init": "pretrained", "step": 7, "finetune": {"lr": 1}, "train_examples": 8,
            "dev_examples": 8, "model_identity": "mlflow:abc"}
    write_results(path, {**base, "model": "/runs/a (final_model/fp32)", "v": 1})
    write_results(path, {**base, "step": 5, "model": "/runs/a (checkpoints/step_5)", "v": 2})
    write_results(path, {**base, "model": "runs:/abc (checkpoint step 7)", "v": 3})
    write_results(path, {**base, "model_identity": "path:/other", "model": "/other", "v": 4})
    assert sorted(r["v"] for r in json.loads(path.read_text())["results"]) == [2, 3, 4]
    assert sorted(p.name for p in tmp_path.iterdir()) == [RESULTS_FILE]  # no lock file left behind


def test_an_interrupted_write_keeps_the_results_and_leaves_no_lock(tmp_path, monkeypatch):
    """Ctrl-C while downstream.json is written: the previous file stays whole; no lock or temporary file."""
    import json
    import os

    from albert_dist.apps.finetune.run import RESULTS_FILE, write_results

    path = tmp_path / RESULTS_FILE
    write_results(path, {"task": "sst2", "v": 1})

    def interrupted(*args):
        raise KeyboardInterrupt

    monkeypatch.setattr(os, "replace", interrupted)
    with pytest.raises(KeyboardInterrupt):
        write_results(path, {"task": "rte", "v": 2})
    assert json.loads(path.read_text())["results"] == [{"task": "sst2", "v": 1}]
    assert sorted(p.name for p in tmp_path.iterdir()) == [RESULTS_FILE]


def test_a_run_the_store_does_not_hold_is_one_line_with_the_store_hint(tmp_path, monkeypatch):
    """MLflow's "no such run" (RESOURCE_DOES_NOT_EXIST), raised inside tracking/fetch.py, reaches the fine-tuning
    source as its one SourceError: MLflow's message, the store and the hint to pass the pretraining job's store."""
    from mlflow.exceptions import MlflowException
    from mlflow.protos.databricks_pb2 import RESOURCE_DOES_NOT_EXIST

    from albert_dist.apps.finetune.source import SourceError, from_mlflow_run
    from albert_dist.tracking import fetch

    class NoRuns:
        def get_run(self, run_id):
            raise MlflowException(f"Run '{run_id}' not found", error_code=RESOURCE_DOES_NOT_EXIST)

    monkeypatch.setattr(fetch, "_client", lambda uri: NoRuns())
    run_id = "0123456789abcdef0123456789abcdef"
    with pytest.raises(SourceError) as info:
        from_mlflow_run(run_id, None, "http://127.0.0.1:9", tmp_path)
    assert str(info.value) == (f"MLflow run {run_id} (http://127.0.0.1:9): Run '{run_id}' not found; is this the store "
                               "the pretraining job logged to? (--tracking-uri or MLFLOW_TRACKING_URI)")


def test_ctrl_c_before_any_task_finished_says_so_and_writes_nothing(world, capsys, monkeypatch):
    """Ctrl-C during the first fine-tune: exit 130, one line saying no task finished (it named a downstream.json
    that did not exist), and none written. tests/integration/test_finetune.py has the interrupt after a task."""
    import albert_dist.apps.finetune.train as ft

    root, run = world

    def interrupted(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(ft, "finetune_once", interrupted)
    out = root / "ctrl_c"
    code = cli_main(["finetune", str(run), "--task", "sst2", "--data-dir", str(root / "sst2"), "--seeds", "1",
                     "--no-tracking", "--output", str(out)])
    err = [line for line in capsys.readouterr().err.strip().splitlines() if "%|" not in line]  # tqdm's bars
    assert code == 130 and err == ["albert-dist finetune: interrupted (Ctrl-C); no task finished, nothing written"]
    assert not (out / "downstream.json").exists()
