"""`albert-dist train` and `albert-dist finetune` agree about a tokenizer with fewer pieces than `model.vocab_size`
(issue 46): train warns once, naming the embedding rows no token id reaches, and trains; finetune scores the run it
left. A tokenizer with more pieces than the model stays an error in both (train: tests/unit/test_data_sources.py's
preflight cases; finetune: tests/unit/test_finetune_bad_inputs.py).

Before the change: train said nothing and finetune of its run was exit 2 "the tokenizer has 8000 pieces but the
model's vocab_size is 8064".
"""
from __future__ import annotations

import json

import pytest
from helpers import read_metrics, run_cli

from albert_dist.cli import main as cli_main
from albert_dist.data.tokenizer import load_tokenizer
from fixtures.finetune_run import write_sst2

pytestmark = pytest.mark.integration
pytest.importorskip("transformers")

RECIPE = "configs/pretrain/albert-tiny-wikitext.yaml"
TOKENIZER = "data/sample/spiece.model"
VOCAB = 8064
#: 2 steps of 1 sequence of 16 tokens, ZeRO-0, no loader workers (tests/integration/test_presets_train.py's SHORT)
SHORT = ["max_steps=2", "engine.zero_stage=0", "engine.train_micro_batch_size_per_gpu=1", "data.max_seq_length=16",
         "data.max_predictions_per_seq=2", "data.num_workers=0", "data.eval_examples=2", "tracking.enabled=false",
         "progress_bar=false", "log_interval_steps=1", f"data.tokenizer_path={TOKENIZER}"]


def test_train_warns_of_the_untrained_rows_and_finetune_scores_the_run(tmp_path, capsys):
    pieces = load_tokenizer(TOKENIZER).get_piece_size()
    assert pieces < VOCAB  # the case under test (the bundled tokenizer has 8000 pieces)
    run_dir = tmp_path / "run"
    proc = run_cli("train", "--config", RECIPE, f"model.vocab_size={VOCAB}", *SHORT, f"run_dir={run_dir}")
    assert proc.returncode == 0, proc.stderr[-3000:]
    output = proc.stdout + proc.stderr
    warned = [line for line in output.splitlines() if "embedding rows no token id reaches" in line]
    assert len(warned) == 1, output[-3000:]  # once, from rank 0's preflight
    assert f"model.vocab_size ({VOCAB}) is larger than the {pieces} pieces" in warned[0]
    assert f": {VOCAB - pieces} embedding rows" in warned[0]
    assert [r["step"] for r in read_metrics(run_dir, "train/loss")] == [1, 2]

    write_sst2(tmp_path / "sst2", 8, 8)
    code = cli_main(["finetune", str(run_dir), "--task", "sst2", "--data-dir", str(tmp_path / "sst2"), "--seeds",
                     "1", "--epochs", "1", "--no-tracking"])
    err = capsys.readouterr().err
    assert code == 0, err[-3000:]
    (entry,) = json.loads((run_dir / "downstream.json").read_text())["results"]
    assert entry["source"]["config"]["vocab_size"] == VOCAB and entry["step"] == 2
    assert 0.0 <= entry["seeds"]["1"]["accuracy"] <= 1.0
