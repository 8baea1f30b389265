"""`albert-dist finetune`'s inputs: GLUE metrics against direct computations, GLUE-format and CSV/JSONL/parquet
task files written here, and the bad inputs that must stop it before any training."""
from __future__ import annotations

import json
import math

import numpy as np
import pytest

from albert_dist.apps.finetune import metrics
from albert_dist.apps.finetune.tasks import TaskError, load_files, load_glue
from fixtures.finetune_run import write_glue_tsv


# ---- metrics: hand-computed references (confusion counts, rank formulas) ----
def test_classification_metrics_equal_their_definitions():
    labels = np.array([1, 1, 1, 0, 0, 0, 1, 0])
    preds = np.array([1, 0, 1, 0, 1, 0, 1, 1])
    tp, fp, fn, tn = 3, 2, 1, 2
    assert metrics.accuracy(preds, labels) == pytest.approx(5 / 8)
    assert metrics.f1(preds, labels) == pytest.approx(2 * tp / (2 * tp + fp + fn))
    mcc = (tp * tn - fp * fn) / math.sqrt((tp + fp) * (tp + fn) * (tn + fp) * (tn + fn))
    assert metrics.matthews_correlation(preds, labels) == pytest.approx(mcc)
    assert metrics.matthews_correlation(np.zeros(8, int), labels) == 0.0  # constant prediction


def test_correlations_equal_their_definitions():
    rng = np.random.default_rng(0)
    y = rng.normal(size=50)
    p = y + rng.normal(size=50)
    assert metrics.pearson(p, y) == pytest.approx(np.corrcoef(p, y)[0, 1])
    rank = lambda x: np.argsort(np.argsort(x))  # noqa: E731 - no ties in continuous draws
    assert metrics.spearmanr(p, y) == pytest.approx(np.corrcoef(rank(p), rank(y))[0, 1])
    assert metrics.pearson(np.ones(50), y) == 0.0


def test_compute_takes_argmax_of_logits_and_squeezes_regression():
    logits = np.array([[0.1, 0.9], [2.0, -1.0], [0.0, 3.0]])
    assert metrics.compute(("accuracy", "f1"), logits, np.array([1, 0, 0])) == pytest.approx(
        {"accuracy": 2 / 3, "f1": 2 / 3})
    out = metrics.compute(("pearson",), np.array([[1.0], [2.0], [3.5]]), np.array([1.0, 2.0, 3.0]))
    assert out["pearson"] == pytest.approx(np.corrcoef([1, 2, 3.5], [1, 2, 3])[0, 1])


# ---- GLUE's layout ----
def test_glue_sst2_stsb_cola_and_mnli_files(tmp_path):
    write_glue_tsv(tmp_path / "sst2/train.tsv", ["sentence", "label"], [['a "quoted b', "1"], ["c", "0"]])
    write_glue_tsv(tmp_path / "sst2/dev.tsv", ["sentence", "label"], [["d", "0"], ["bad", "row", "x"]])
    task = load_glue("sst2", str(tmp_path / "sst2"))
    assert task.train.texts == ['a "quoted b', "c"] and task.train.labels == [1, 0] and task.train.pairs is None
    assert len(task.dev) == 1  # the malformed row is skipped (and logged)
    assert task.metrics == ("accuracy",) and task.num_labels == 2

    header = ["index", "genre", "filename", "year", "old_index", "source1", "source2", "sentence1", "sentence2", "score"]
    row = ["0", "g", "f", "y", "0", "s", "s", "one", "two", "3.800"]
    for name in ("train.tsv", "dev.tsv"):
        write_glue_tsv(tmp_path / "stsb" / name, header, [row])
    task = load_glue("stsb", str(tmp_path / "stsb"))
    assert (task.train.texts, task.train.pairs, task.train.labels) == (["one"], ["two"], [3.8])
    assert task.is_regression and task.metrics == ("pearson", "spearmanr")

    for name in ("train.tsv", "dev.tsv"):  # CoLA has no header row
        (tmp_path / "cola").mkdir(exist_ok=True)
        (tmp_path / "cola" / name).write_text("gj04\t1\t\tThe sailors rode.\ngj04\t0\t*\tThe rode.\n")
    task = load_glue("cola", str(tmp_path / "cola"))
    assert task.train.texts == ["The sailors rode.", "The rode."] and task.train.labels == [1, 0]

    mnli = ["index", "sentence1", "sentence2", "gold_label"]
    write_glue_tsv(tmp_path / "mnli/train.tsv", mnli, [["0", "p", "h", "neutral"], ["1", "p", "h", "contradiction"]])
    write_glue_tsv(tmp_path / "mnli/dev_matched.tsv", mnli, [["0", "p", "h", "entailment"]])
    task = load_glue("mnli", str(tmp_path / "mnli"))
    assert task.train.labels == [1, 2] and task.dev.labels == [0]  # the hub's ClassLabel order


def test_subset_is_seeded_and_keeps_file_order(tmp_path):
    rows = [[f"s{i}", str(i % 2)] for i in range(100)]
    for name in ("train.tsv", "dev.tsv"):
        write_glue_tsv(tmp_path / name, ["sentence", "label"], rows)
    train = load_glue("sst2", str(tmp_path)).train
    a, b, c = train.subset(10, 0), train.subset(10, 0), train.subset(10, 1)
    assert a.texts == b.texts != c.texts and len(a) == 10
    assert [int(t[1:]) for t in a.texts] == sorted(int(t[1:]) for t in a.texts)
    assert train.subset(1000, 0) is train


# ---- any labelled files ----
def test_csv_jsonl_and_parquet_tasks(tmp_path):
    import pyarrow as pa
    import pyarrow.parquet as pq

    (tmp_path / "train.csv").write_text('text,other,y\n"hello, world",x,pos\nbye,z,neg\n')
    (tmp_path / "dev.jsonl").write_text(json.dumps({"text": "hi", "other": "q", "y": "neg"}) + "\n")
    with pytest.raises(TaskError, match="label sets differ"):  # dev lacks "pos"
        load_files(str(tmp_path / "train.csv"), str(tmp_path / "dev.jsonl"), "text", "other", "y")
    (tmp_path / "dev.jsonl").write_text("\n".join(json.dumps({"text": t, "other": "q", "y": y})
                                                  for t, y in (("hi", "neg"), ("yo", "pos"))) + "\n")
    task = load_files(str(tmp_path / "train.csv"), str(tmp_path / "dev.jsonl"), "text", "other", "y")
    assert task.label_names == ("neg", "pos") and task.train.labels == [1, 0] and task.dev.labels == [0, 1]
    assert task.train.texts == ["hello, world", "bye"] and task.train.pairs == ["x", "z"]
    assert task.metrics == ("accuracy", "f1") and task.name == tmp_path.name  # <task>/train.csv is task <task>

    pq.write_table(pa.table({"s": ["a", "b", "c"], "score": [0.5, 1.0, 2.25]}), tmp_path / "train.parquet")
    pq.write_table(pa.table({"s": ["d"], "score": [1.5]}), tmp_path / "dev.parquet")
    task = load_files(str(tmp_path / "train.parquet"), str(tmp_path / "dev.parquet"), "s", None, "score")
    assert task.is_regression and task.train.labels == [0.5, 1.0, 2.25]  # inferred from float labels
    ints = load_files(str(tmp_path / "train.parquet"), str(tmp_path / "train.parquet"), "s", None, "score",
                      task_type="classification")
    assert ints.label_names == ("0.5", "1", "2.25")


def test_label_mistakes_say_what_to_change(tmp_path):
    """Whole-number train scores with fractional dev scores suggest --task-type regression; an empty label
    cell is counted with its data rows instead of becoming a class ''; a file task is named after its file
    (its folder when the file is train.*)."""
    write_glue_tsv(tmp_path / "t/train.tsv", ["text", "score"], [["a", "1"], ["b", "4"]])
    write_glue_tsv(tmp_path / "t/dev.tsv", ["text", "score"], [["c", "2.5"], ["d", "4"]])
    with pytest.raises(TaskError, match="label sets differ.*pass --task-type regression"):
        load_files(str(tmp_path / "t/train.tsv"), str(tmp_path / "t/dev.tsv"), "text", None, "score")
    assert load_files(str(tmp_path / "t/train.tsv"), str(tmp_path / "t/dev.tsv"), "text", None, "score",
                      task_type="regression").dev.labels == [2.5, 4.0]
    write_glue_tsv(tmp_path / "e/reviews.tsv", ["text", "y"], [["a", "pos"], ["b", ""], ["c", "neg"], ["d", ""]])
    write_glue_tsv(tmp_path / "e/dev.tsv", ["text", "y"], [["a", "pos"], ["c", "neg"]])
    with pytest.raises(TaskError, match=r"reviews.tsv: 2 rows with an empty label \(data rows \[2, 4\]"):
        load_files(str(tmp_path / "e/reviews.tsv"), str(tmp_path / "e/dev.tsv"), "text", None, "y")
    write_glue_tsv(tmp_path / "e/reviews.tsv", ["text", "y"], [["a", "pos"], ["c", "neg"]])
    assert load_files(str(tmp_path / "e/reviews.tsv"), str(tmp_path / "e/dev.tsv"), "text", None, "y").name == "reviews"


@pytest.mark.parametrize("case, match", [
    ("unknown_task", "unknown task 'sst3'"),
    ("missing_column", "no column 'text' \\(--text-column\\)"),
    ("glue_missing_column", "no label column 'label'"),
    ("glue_bad_label", "labels \\['2'\\] not in the label set"),
    ("missing_file", "no such file"),
])
def test_bad_task_inputs_name_the_field(tmp_path, case, match):
    write_glue_tsv(tmp_path / "ok/train.tsv", ["sentence", "label"], [["a", "0"], ["b", "1"]])
    write_glue_tsv(tmp_path / "ok/dev.tsv", ["sentence", "label"], [["a", "0"]])
    with pytest.raises(TaskError, match=match):
        if case == "unknown_task":
            load_glue("sst3", str(tmp_path / "ok"))
        elif case == "missing_column":
            load_files(str(tmp_path / "ok/train.tsv"), str(tmp_path / "ok/dev.tsv"), "text", None, "label")
        elif case == "glue_missing_column":
            write_glue_tsv(tmp_path / "x/train.tsv", ["sentence", "lbl"], [["a", "0"]])
            load_glue("sst2", str(tmp_path / "x"))
        elif case == "glue_bad_label":
            write_glue_tsv(tmp_path / "ok/dev.tsv", ["sentence", "label"], [["a", "2"]])
            load_glue("sst2", str(tmp_path / "ok"))
        else:
            (tmp_path / "ok/dev.tsv").unlink()
            load_glue("sst2", str(tmp_path / "ok"))


def test_encoding_gives_pretrainings_sentencepiece_ids_and_segments():
    """The run's tokenizer through transformers (what `finetune` feeds the model) == sentencepiece's ids, with
    [CLS] a [SEP] b [SEP], token types 0 then 1, truncated longest-first."""
    pytest.importorskip("transformers")
    import sentencepiece as spm

    from albert_dist.data.tokenizer import CLS_ID, SEP_ID
    from albert_dist.apps.finetune.source import sentencepiece_tokenizer
    from albert_dist.apps.finetune.tasks import Split
    from albert_dist.apps.finetune.train import encode
    from helpers import REPO

    path = REPO / "data" / "sample" / "spiece.model"
    sp = spm.SentencePieceProcessor(model_file=str(path))
    a, b = "The Ulster Unionists, in 1998 ... cafés!", "A second sentence."
    encoded = encode(sentencepiece_tokenizer(path), Split([a, a], [b, b], [0, 1]), 512)
    ids_a, ids_b = sp.encode(a), sp.encode(b)
    assert encoded[0]["input_ids"] == [CLS_ID, *ids_a, SEP_ID, *ids_b, SEP_ID]
    assert encoded[0]["token_type_ids"] == [0] * (len(ids_a) + 2) + [1] * (len(ids_b) + 1)
    assert encoded[1]["labels"] == 1
    short = encode(sentencepiece_tokenizer(path), Split([a], [b], [0]), 10)[0]["input_ids"]
    assert len(short) == 10 and short[0] == CLS_ID and short.count(SEP_ID) == 2

