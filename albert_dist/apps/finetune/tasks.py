"""Downstream tasks: GLUE by name (GLUE's TSV layout in a local directory, or the hub) and any labelled
CSV/TSV/JSONL/parquet files, read into lists of texts and labels, checked before any training.

GLUE's files (Wang et al. 2019, https://gluebenchmark.com/tasks; the layout of its ``download_glue_data.py``):
``train.tsv`` and ``dev.tsv`` (MNLI: ``dev_matched.tsv``), tab-separated, no quoting, a header row except CoLA's
(source, label, notes, sentence). Label values and their ids follow the hub's ``nyu-mll/glue`` ClassLabel order,
so a model fine-tuned from either source predicts the same ids. A row with another number of fields than the
header (a handful in GLUE's MNLI/QQP files) is skipped, counted and logged.
"""
from __future__ import annotations

import csv
import dataclasses
import json
import logging
import math
import random
import sys
from pathlib import Path
from typing import Any, Optional, Sequence

log = logging.getLogger(__name__)


@dataclasses.dataclass(frozen=True)
class GlueTask:
    """Where one GLUE task keeps its texts and labels, its metrics and its fine-tuning defaults."""

    text_column: str
    """TSV column of the first text."""
    pair_column: Optional[str]
    """TSV column of the second text; None for single-sentence tasks."""
    label_column: str
    """TSV column of the label (a class name, or a float score for STS-B)."""
    labels: Optional[tuple[str, ...]]
    """Class values as written in the TSV, in the hub's id order; None = regression."""
    metrics: tuple[str, ...]
    """`albert_dist.apps.finetune.metrics` names, the primary one first."""
    hub_columns: tuple[str, Optional[str]]
    """The hub dataset's text and pair columns (its label column is ``label``, already ids)."""
    dev_file: str = "dev.tsv"
    """The dev file of the local layout."""
    hub_dev_split: str = "validation"
    """The hub's dev split."""
    columns: Optional[tuple[str, ...]] = None
    """Column names of a file without a header row (CoLA); None = the first row is the header."""
    max_seq_length: int = 128
    """Default --max-seq-length (tokens, with [CLS]/[SEP])."""


#: GLUE by name. Metrics as GLUE reports them (F1 + accuracy for MRPC/QQP, Matthews for CoLA, Pearson + Spearman
#: for STS-B); the primary (first) one is what `downstream/<task>/<metric>` ranks runs by.
GLUE_TASKS: dict[str, GlueTask] = {
    "cola": GlueTask("sentence", None, "label", ("0", "1"), ("matthews_correlation",), ("sentence", None),
                     columns=("source", "label", "label_notes", "sentence"), max_seq_length=64),
    "sst2": GlueTask("sentence", None, "label", ("0", "1"), ("accuracy",), ("sentence", None), max_seq_length=64),
    "mrpc": GlueTask("#1 String", "#2 String", "Quality", ("0", "1"), ("f1", "accuracy"),
                     ("sentence1", "sentence2")),
    "qqp": GlueTask("question1", "question2", "is_duplicate", ("0", "1"), ("f1", "accuracy"),
                    ("question1", "question2")),
    "stsb": GlueTask("sentence1", "sentence2", "score", None, ("pearson", "spearmanr"), ("sentence1", "sentence2")),
    "mnli": GlueTask("sentence1", "sentence2", "gold_label", ("entailment", "neutral", "contradiction"),
                     ("accuracy",), ("premise", "hypothesis"), dev_file="dev_matched.tsv",
                     hub_dev_split="validation_matched"),
    "qnli": GlueTask("question", "sentence", "label", ("entailment", "not_entailment"), ("accuracy",),
                     ("question", "sentence")),
    "rte": GlueTask("sentence1", "sentence2", "label", ("entailment", "not_entailment"), ("accuracy",),
                    ("sentence1", "sentence2")),
}


class TaskError(ValueError):
    """Bad task input (unknown task, missing file or column, labels that do not fit): the CLI's exit 2."""


@dataclasses.dataclass
class Split:
    """One split: texts, optional second texts, labels (class ids or float targets), same length."""

    texts: list[str]
    pairs: Optional[list[str]]
    labels: list

    def __len__(self) -> int:
        return len(self.texts)

    def subset(self, n: Optional[int], seed: int) -> "Split":
        """At most `n` examples drawn without replacement with `random.Random(seed)` (file order kept);
        all of them when n is None or >= len."""
        if n is None or n >= len(self):
            return self
        keep = sorted(random.Random(seed).sample(range(len(self)), n))
        return Split([self.texts[i] for i in keep], None if self.pairs is None else [self.pairs[i] for i in keep],
                     [self.labels[i] for i in keep])


@dataclasses.dataclass
class TaskData:
    """A task ready to tokenize: train and dev splits, label names (None = regression), metrics."""

    name: str
    train: Split
    dev: Split
    label_names: Optional[tuple[str, ...]]
    metrics: tuple[str, ...]
    source: str
    """Where it was read from, for params and messages."""
    identity: str = ""
    """What the task is, whatever its name: ``glue:<task>`` (any copy of GLUE's data), ``file:<resolved train
    file>``; two tasks of one name but another identity must not share downstream.json or a headline."""

    @property
    def num_labels(self) -> int:
        """Output size of the classifier: classes, or 1 for regression."""
        return 1 if self.label_names is None else len(self.label_names)

    @property
    def is_regression(self) -> bool:
        return self.label_names is None


# ---- reading files ----
def _read_tsv(path: Path, columns: Optional[Sequence[str]] = None) -> tuple[list[str], list[list[str]], int]:
    """(header, rows, skipped) of a tab-separated file read without quoting (GLUE's texts hold bare quotes);
    rows whose field count differs from the header's are skipped and counted."""
    csv.field_size_limit(min(sys.maxsize, 2**31 - 1))  # long texts (QNLI paragraphs)
    with open(path, encoding="utf-8", newline="") as f:
        reader = csv.reader(f, delimiter="\t", quoting=csv.QUOTE_NONE)
        header = list(columns) if columns is not None else next(reader, [])
        rows, skipped = [], 0
        for row in reader:
            if len(row) == len(header):
                rows.append(row)
            elif row:
                skipped += 1
    return header, rows, skipped


def _records(path: Path) -> list[dict[str, Any]]:
    """A CSV (header row), TSV (header row, no quoting), JSON Lines or parquet file as a list of dicts."""
    suffix = "".join(path.suffixes[-2:]) if path.suffix == ".gz" else path.suffix
    if suffix in (".tsv", ".txt"):
        header, rows, skipped = _read_tsv(path)
        if not rows and header:
            raise TaskError(f"{path}: no usable rows ({_skipped_why(skipped, header, False)})")
        if skipped:
            log.warning("%s: %d rows with another field count than the header skipped", path, skipped)
        return [dict(zip(header, row)) for row in rows]
    if suffix == ".csv":
        with open(path, encoding="utf-8", newline="") as f:
            return list(csv.DictReader(f))
    if suffix in (".jsonl", ".json"):
        with open(path, encoding="utf-8") as f:
            return [json.loads(line) for line in f if line.strip()]
    if suffix == ".parquet":
        import pyarrow.parquet as pq

        return pq.read_table(path).to_pylist()
    raise TaskError(f"{path}: unknown file type {path.suffix!r} (use .csv, .tsv, .jsonl or .parquet)")


def _column(records: list[dict], name: Optional[str], path: Path, flag: str) -> Optional[list]:
    if name is None:
        return None
    if not records:
        raise TaskError(f"{path}: no rows")
    if name not in records[0]:
        raise TaskError(f"{path}: no column {name!r} ({flag}); columns: {', '.join(map(str, records[0]))}")
    return [r[name] for r in records]


def _as_float(value: Any) -> Optional[float]:
    if isinstance(value, bool):
        return None
    try:
        out = float(value)
    except (TypeError, ValueError):
        return None
    return out if math.isfinite(out) else None


def _label_key(value: Any) -> str:
    """A class label as text: 1, 1.0 and "1" are one class; other values as written."""
    number = _as_float(value)
    if number is not None and number.is_integer():
        return str(int(number))
    return str(value)


def _class_ids(values: list, names: Sequence[str], where: str) -> list[int]:
    index = {name: i for i, name in enumerate(names)}
    keys = [_label_key(v) for v in values]
    unknown = sorted(set(keys) - set(index))
    if unknown:
        raise TaskError(f"{where}: labels {unknown[:10]} not in the label set {list(names)}")
    return [index[k] for k in keys]


def _floats(values: list, where: str) -> list[float]:
    out = [_as_float(v) for v in values]
    bad = [values[i] for i, v in enumerate(out) if v is None]
    if bad:
        raise TaskError(f"{where}: regression labels must be numbers, got {bad[:5]}")
    return out  # type: ignore[return-value]


def _check_same_label_set(train: list, dev: list, train_where: str, dev_where: str) -> tuple[str, ...]:
    """The sorted class set, after checking that train and dev have the same one (numbers in numeric order)."""
    train_set, dev_set = {_label_key(v) for v in train}, {_label_key(v) for v in dev}
    for values, where in ((train, train_where), (dev, dev_where)):
        empty = [i + 1 for i, v in enumerate(values) if v is None or _label_key(v).strip() == ""]
        if empty:
            raise TaskError(f"{where}: {len(empty)} rows with an empty label (data rows {empty[:5]}; "
                            "--label-column)")
    numeric = all(_as_float(k) is not None for k in train_set | dev_set)
    if train_set != dev_set:
        hint = "; the labels are numbers: for scores pass --task-type regression" if numeric else ""
        raise TaskError(f"label sets differ: {train_where} has {sorted(train_set)[:10]}, {dev_where} has "
                        f"{sorted(dev_set)[:10]} (--label-column){hint}")
    return tuple(sorted(train_set, key=lambda k: (float(k), k) if numeric else (0.0, k)))


def _skipped_why(skipped: int, header: Sequence[str], fixed_columns: bool) -> str:
    """Why a file gave no rows, for its error line: the count skipped and the field count they lacked."""
    if not skipped:
        return "only a header row" if not fixed_columns else "the file holds no rows"
    if fixed_columns:
        return (f"{skipped} rows skipped: none has the task's {len(header)} tab-separated columns "
                f"({', '.join(header)}; no header row)")
    return f"{skipped} rows skipped: none has the header's {len(header)} fields"


# ---- GLUE ----
def _glue_split(spec: GlueTask, path: Path) -> Split:
    if not path.is_file():
        raise TaskError(f"{path}: no such file (--data-dir in GLUE's layout: train.tsv and {spec.dev_file})")
    header, rows, skipped = _read_tsv(path, spec.columns)
    if not header:
        raise TaskError(f"{path}: empty file (no header row)")
    if not rows:  # every row skipped: another task's file (cola's 4 headerless columns on SST-2's 2), or none
        raise TaskError(f"{path}: no usable rows ({_skipped_why(skipped, header, spec.columns is not None)})")
    if skipped:
        log.warning("%s: %d malformed rows skipped (field count differs from the header's)", path, skipped)
    for flag, name in (("text", spec.text_column), ("text pair", spec.pair_column), ("label", spec.label_column)):
        if name is not None and name not in header:
            raise TaskError(f"{path}: no {flag} column {name!r}; header: {', '.join(header)}")
    col = {name: i for i, name in enumerate(header)}
    texts = [r[col[spec.text_column]] for r in rows]
    pairs = None if spec.pair_column is None else [r[col[spec.pair_column]] for r in rows]
    raw = [r[col[spec.label_column]] for r in rows]
    labels = _floats(raw, str(path)) if spec.labels is None else _class_ids(raw, spec.labels, str(path))
    return Split(texts, pairs, labels)


def load_glue(task: str, data_dir: Optional[str]) -> TaskData:
    """GLUE task `task` from `data_dir` (GLUE's TSV layout) or, without one, from the hub (``nyu-mll/glue``).

    Raises:
        TaskError: unknown task; a missing file or column; a label outside the task's label set; the hub
            unreachable (names --data-dir).
    """
    spec = glue_task(task)
    if data_dir is not None:
        root = Path(data_dir)
        if not root.is_dir():
            raise TaskError(f"--data-dir {data_dir}: not a directory")
        train, dev = _glue_split(spec, root / "train.tsv"), _glue_split(spec, root / spec.dev_file)
        return TaskData(task, train, dev, spec.labels, spec.metrics, str(root), f"glue:{task}")
    return _load_glue_hub(task, spec)


def glue_task(task: str) -> GlueTask:
    """The `GlueTask` of a name; `TaskError` naming the known ones otherwise."""
    if task not in GLUE_TASKS:
        raise TaskError(f"unknown task {task!r}; GLUE tasks: {', '.join(GLUE_TASKS)} (or --train-file/--validation-file)")
    return GLUE_TASKS[task]


def _load_glue_hub(task: str, spec: GlueTask) -> TaskData:
    import datasets

    try:
        ds = datasets.load_dataset("nyu-mll/glue", task)
    except Exception as exc:  # noqa: BLE001 - offline shows as one of many exception types
        raise TaskError(f"{task}: could not load nyu-mll/glue from the hub ({type(exc).__name__}: "
                        f"{str(exc)[:200]}); offline, pass --data-dir with GLUE's TSV files") from exc
    text, pair = spec.hub_columns

    def split(name: str) -> Split:
        part = ds[name]
        labels = [float(v) for v in part["label"]] if spec.labels is None else [int(v) for v in part["label"]]
        return Split(list(part[text]), None if pair is None else list(part[pair]), labels)

    return TaskData(task, split("train"), split(spec.hub_dev_split), spec.labels, spec.metrics, "hub:nyu-mll/glue",
                    f"glue:{task}")


# ---- any labelled files ----
def load_files(train_file: str, validation_file: str, text_column: str, text_pair_column: Optional[str],
               label_column: str, task_type: str = "auto", name: Optional[str] = None) -> TaskData:
    """A task from two files (CSV, TSV, JSONL or parquet, by suffix) with named columns.

    `task_type` "classification", "regression" or "auto" (regression when every train label is a number and
    one of them is not a whole number, as transformers' run_glue infers it from float labels). Classification
    labels are the sorted set of the train file's values, which must equal the validation file's.
    Metrics: accuracy (and F1 of class 1 with two classes) / Pearson and Spearman.

    Raises:
        TaskError: a missing file or column, an empty file, different label sets, non-numeric regression labels.
    """
    if task_type not in ("auto", "classification", "regression"):
        raise TaskError(f"--task-type must be auto, classification or regression, got {task_type!r}")
    splits = {}
    for flag, file in (("--train-file", train_file), ("--validation-file", validation_file)):
        path = Path(file)
        if not path.is_file():
            raise TaskError(f"{flag} {file}: no such file")
        records = _records(path)
        if not records:
            raise TaskError(f"{flag} {file}: no rows (an empty file, or only a header row)")
        splits[flag] = (path, _column(records, text_column, path, "--text-column"),
                        _column(records, text_pair_column, path, "--text-pair-column"),
                        _column(records, label_column, path, "--label-column"))
    (tpath, ttext, tpair, tlab), (dpath, dtext, dpair, dlab) = splits["--train-file"], splits["--validation-file"]
    if task_type == "auto":
        numbers = [_as_float(v) for v in tlab]
        is_float = all(v is not None for v in numbers) and any(not v.is_integer() for v in numbers)  # type: ignore[union-attr]
        task_type = "regression" if is_float else "classification"
    if task_type == "regression":
        train = Split(list(map(str, ttext)), None if tpair is None else list(map(str, tpair)), _floats(tlab, str(tpath)))
        dev = Split(list(map(str, dtext)), None if dpair is None else list(map(str, dpair)), _floats(dlab, str(dpath)))
        return TaskData(name or _file_task_name(tpath), train, dev, None, ("pearson", "spearmanr"), str(tpath),
                        file_task_identity(str(tpath)))
    names = _check_same_label_set(tlab, dlab, str(tpath), str(dpath))
    train = Split(list(map(str, ttext)), None if tpair is None else list(map(str, tpair)), _class_ids(tlab, names, str(tpath)))
    dev = Split(list(map(str, dtext)), None if dpair is None else list(map(str, dpair)), _class_ids(dlab, names, str(dpath)))
    metrics = ("accuracy", "f1") if len(names) == 2 else ("accuracy",)
    return TaskData(name or _file_task_name(tpath), train, dev, names, metrics, str(tpath),
                    file_task_identity(str(tpath)))


def file_task_identity(train_file: str) -> str:
    """`TaskData.identity` of a task read from files: ``file:<the train file, resolved>``."""
    return f"file:{Path(train_file).resolve()}"


def _file_task_name(train_file: Path) -> str:
    """A file task's name when none is given: the train file's stem, or its folder's name when the stem only
    says "train" (``mytask/train.tsv`` is task ``mytask``, not ``train``)."""
    stem = train_file.name.split(".")[0]
    return train_file.resolve().parent.name if stem.lower() in ("train", "training") else stem
