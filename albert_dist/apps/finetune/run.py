"""`albert-dist finetune`: fine-tune a pretrained model on GLUE-style tasks over several seeds and score it.

    albert-dist finetune RUN_DIR|RUN_ID|HF_DIR --task sst2 stsb --data-dir DIR [--step N] [--init random]
                         [--seeds 1 2 3] [--max-train-samples N] [--learning-rate ...] [--output DIR]
    albert-dist finetune MODEL --train-file train.csv --validation-file dev.csv --text-column text
                         [--text-pair-column t2] --label-column label [--task-type auto|classification|regression]

MODEL is a run directory or an MLflow run id (what `albert_dist.runs` says it means: its newest verified
checkpoint, or its final model when that holds the same step; with --step N its checkpoint step_N), or a
transformers ALBERT directory; --init random fine-tunes the same
config from fresh weights (the floor every table needs). GLUE tasks (cola sst2 mrpc qqp stsb mnli qnli rte)
are read from --data-dir (GLUE's TSV layout: the task's directory, or a directory holding one per task named
<task>, glue-<task> or GLUE's own name, e.g. SST-2), else from the hub (nyu-mll/glue). Each (task, seed) is one
fine-tune with transformers' Trainer; the table gives the median and min-max over the seeds of GLUE's metrics
(scikit-learn / scipy). Results go to downstream.json in the run directory (or --output DIR), and to MLflow: a
child run per fine-tune under the pretraining run, which gets downstream/<task>/<metric> (the median) at the
checkpoint's step. See docs/finetune.md.
"""
from __future__ import annotations

import contextlib
import dataclasses
import datetime
import json
import logging
import math
import os
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any, Iterator, Optional

from albert_dist.apps.finetune.options import FinetuneOptions

log = logging.getLogger(__name__)

RESULTS_FILE = "downstream.json"
#: Fine-tuning defaults per task (each a flag). Batch sizes and warmup as the ALBERT paper's GLUE recipe
#: (Lan et al. 2020, Table 17 (appendix A.4): batch 16 for CoLA/STS-B, 32 for the others; warmup ~10 %); 3 epochs
#: as BERT; the learning rate is one for small models (1e-4: the paper's 1e-5..5e-5 are for ALBERT-xxlarge and
#: leave a 1-4M-parameter encoder barely moved in 3 epochs); max length 64 for the single-sentence tasks (SST-2
#: and CoLA sentences are shorter), 128 for pairs.
DEFAULT_LEARNING_RATE = 1e-4
DEFAULT_EPOCHS = 3.0
DEFAULT_WARMUP_RATIO = 0.1
DEFAULT_BATCH = {"cola": 16, "stsb": 16}
DEFAULT_BATCH_OTHER = 32
#: GLUE's own directory names (download_glue_data.py), tried in --data-dir after <task> and glue-<task>.
GLUE_DIR_NAMES = {"cola": "CoLA", "sst2": "SST-2", "mrpc": "MRPC", "qqp": "QQP", "stsb": "STS-B", "mnli": "MNLI",
                  "qnli": "QNLI", "rte": "RTE"}


def _glue_dir(task: str, data_dir: Optional[str], several: bool) -> Optional[str]:
    """The directory of `task` under --data-dir: the directory itself when it holds train.tsv and one task is
    asked for, else its subdirectory <task>, glue-<task> or GLUE's name."""
    from albert_dist.apps.finetune.tasks import TaskError, glue_task

    glue_task(task)  # an unknown name is named as such, before any folder is looked for
    if data_dir is None:
        return None
    root = Path(data_dir)
    if (root / "train.tsv").is_file() and not several:
        return str(root)
    names = (task, f"glue-{task}", GLUE_DIR_NAMES.get(task, task))
    for name in names:
        if (root / name / "train.tsv").is_file():
            return str(root / name)
    if root.is_dir() and not (root / "train.tsv").is_file():  # a parent of task folders without this task's
        raise TaskError(f"--data-dir {data_dir}: no {task} task in it (looked for "
                        f"{', '.join(f'{n}/train.tsv' for n in dict.fromkeys(names))})")
    return str(root)  # load_glue names the missing file or directory


def load_tasks(args: FinetuneOptions) -> list:
    """The tasks asked for, read and checked; `TaskError` for bad input."""
    from albert_dist.apps.finetune.tasks import TaskError, glue_task, load_files, load_glue

    if bool(args.task) == bool(args.train_file):
        raise TaskError("give --task NAME [NAME ...] or --train-file/--validation-file (one of them)")
    if args.train_file:
        if not args.validation_file:
            raise TaskError("--train-file needs --validation-file")
        return [load_files(args.train_file, args.validation_file, args.text_column, args.text_pair_column,
                           args.label_column, args.task_type, args.task_name)]
    for task in args.task:
        glue_task(task)  # every name checked before any file is read
    return [load_glue(t, _glue_dir(t, args.data_dir, len(args.task) > 1)) for t in args.task]


def finetune_config(args: FinetuneOptions, task: str, max_positions: int):
    """The task's `FinetuneConfig` from flags and per-task defaults; `ValueError` naming a bad flag."""
    from albert_dist.apps.finetune.tasks import GLUE_TASKS
    from albert_dist.apps.finetune.train import FinetuneConfig
    from albert_dist.model.classifier import CLASSIFIER_DROPOUT_PROB

    glue = GLUE_TASKS.get(task)
    max_len = args.max_seq_length if args.max_seq_length is not None else (glue.max_seq_length if glue else 128)
    if max_len > max_positions:
        if args.max_seq_length is not None:
            raise ValueError(f"--max-seq-length {max_len} exceeds the model's max_position_embeddings {max_positions}")
        max_len = max_positions
    def given(value: Any, default: Any) -> Any:
        return default if value is None else value

    return FinetuneConfig(
        learning_rate=given(args.learning_rate, DEFAULT_LEARNING_RATE),
        num_train_epochs=given(args.epochs, DEFAULT_EPOCHS),
        per_device_train_batch_size=given(args.batch_size, DEFAULT_BATCH.get(task, DEFAULT_BATCH_OTHER)),
        max_seq_length=max_len, warmup_ratio=given(args.warmup_ratio, DEFAULT_WARMUP_RATIO),
        weight_decay=args.weight_decay, classifier_dropout_prob=given(args.classifier_dropout, CLASSIFIER_DROPOUT_PROB),
        bf16=args.bf16, deepspeed=args.deepspeed)


#: Suffixes of a file task's `data` (its train file), which tells it from a GLUE directory in entries written
#: before `task_identity` was recorded.
_FILE_SUFFIXES = (".csv", ".tsv", ".txt", ".jsonl", ".json", ".parquet", ".gz")


def _task_identity(entry: dict[str, Any]) -> str:
    from albert_dist.apps.finetune.tasks import file_task_identity

    if entry.get("task_identity"):
        return str(entry["task_identity"])
    data = str(entry.get("data", ""))
    return file_task_identity(data) if Path(data).suffix.lower() in _FILE_SUFFIXES else f"glue:{entry.get('task')}"


def check_task_names(results: Path, tasks: list) -> None:
    """Refuse a task whose name already names another task in `results` (downstream.json): its entries and the
    run's ``downstream/<name>/*`` headline would mix two tasks (two file tasks in one folder both default to
    the folder's name).

    Raises:
        TaskError: naming the name, both tasks and --task-name.
    """
    from albert_dist.apps.finetune.tasks import TaskError

    taken = {}
    for entry in read_results(results):
        taken.setdefault(entry.get("task"), (_task_identity(entry), entry.get("data")))
    for task in tasks:
        identity, data = taken.get(task.name, (task.identity, None))
        if identity != task.identity:
            raise TaskError(f"task name {task.name!r} already names another task in {results} ({data}); "
                            f"give {task.source} another name with --task-name")


def setup_line(task: Any, cfg: Any, train_examples: int, dev_examples: int, seeds: list[int],
               subset_seed: int) -> str:
    """What a task's scores depend on besides the model, as one line (the run's ``downstream/<task>/setup`` tag,
    `albert_dist.tracking.finetune_runs.DownstreamRuns.log_summary`): data, subset sizes, seeds, hyper-parameters."""
    hyper = {k: v for k, v in dataclasses.asdict(cfg).items() if k != "deepspeed"}  # how it ran, not what
    return " ".join([f"data={task.source}", f"train={train_examples}", f"dev={dev_examples}",
                     f"seeds={','.join(map(str, seeds))}", f"subset_seed={subset_seed}",
                     *(f"{k}={v}" for k, v in hyper.items())])


def summarize(per_seed: dict[int, dict[str, float]], metrics: tuple[str, ...]) -> dict[str, dict[str, float]]:
    """Median, min and max over seeds of each metric (the anchors' report: MosaicBERT, Cramming)."""
    return {m: {"median": statistics.median(s[m] for s in per_seed.values()),
                "min": min(s[m] for s in per_seed.values()), "max": max(s[m] for s in per_seed.values())}
            for m in metrics}


def write_results(path: Path, entry: dict[str, Any]) -> None:
    """Add `entry` to ``downstream.json`` (``{"results": [...]}``), replacing an earlier entry of the same
    fine-tune (`same_finetune`: a rerun, whatever named its model); under an exclusive lock on
    ``downstream.json.lock`` beside it (`_results_lock`), so concurrent commands scoring one run keep every entry.
    An interrupt (Ctrl-C) leaves the previous file whole, and no lock or temporary file behind."""
    path.parent.mkdir(parents=True, exist_ok=True)
    # several `finetune` processes may score one run at once (a task or checkpoint each): one writer at a time
    with _results_lock(path.with_suffix(".json.lock")):
        results = [r for r in read_results(path) if not same_finetune(r, entry)]
        results.append(entry)
        tmp = path.with_suffix(f".json.tmp{os.getpid()}")
        try:
            tmp.write_text(json.dumps({"results": results}, indent=2) + "\n")
            os.replace(tmp, path)
        finally:
            tmp.unlink(missing_ok=True)


def read_results(path: Path) -> list[dict[str, Any]]:
    """The entries of a ``downstream.json`` ([] when there is none, or it is unreadable)."""
    try:
        return list(json.loads(path.read_text()).get("results", []))
    except (OSError, ValueError, AttributeError):
        return []


#: What makes two downstream.json entries the same fine-tune (besides the model, `_model_key`).
ENTRY_KEY = ("task", "init", "step", "finetune", "train_examples", "dev_examples")


def _model_key(entry: dict[str, Any]) -> Any:
    # the resolved identity (an MLflow run id, or a resolved path); entries written before it existed: the model
    return entry.get("model_identity") or entry.get("model")


def same_finetune(a: dict[str, Any], b: dict[str, Any]) -> bool:
    """`a` and `b` are the same fine-tune: same task, init, step, hyper-parameters and subset sizes, and the same
    model whatever named it (a run directory and its MLflow run id are one model: `ModelSource.identity`)."""
    return all(a.get(k) == b.get(k) for k in ENTRY_KEY) and _model_key(a) == _model_key(b)


@contextlib.contextmanager
def _results_lock(lock_path: Path) -> Iterator[None]:
    """An exclusive flock on `lock_path`, removed when released (so no lock file outlives a command). A waiter
    that wakes on a file its holder has just removed sees another inode at the path and locks again, the usual
    flock-and-unlink protocol."""
    from albert_dist.job.lock import flock

    while True:
        fd = os.open(lock_path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            flock(fd)
            try:
                held = os.stat(lock_path)
            except FileNotFoundError:
                held = None
            mine = os.fstat(fd)
        except BaseException:
            os.close(fd)
            raise
        if held is not None and (held.st_ino, held.st_dev) == (mine.st_ino, mine.st_dev):
            break
        os.close(fd)
    try:
        yield
    finally:
        lock_path.unlink(missing_ok=True)  # while still holding it: the next waiter relocks a fresh file
        os.close(fd)


def format_table(entries: list[dict[str, Any]]) -> str:
    """One row per task and metric: median, min and max over the seeds."""
    rows = [("task", "metric", "median", "min", "max", "seeds", "train", "dev")]
    for e in entries:
        for metric, s in e["summary"].items():
            rows.append((e["task"], metric, f"{s['median']:.4f}", f"{s['min']:.4f}", f"{s['max']:.4f}",
                         str(len(e["seeds"])), str(e["train_examples"]), str(e["dev_examples"])))
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    return "\n".join("  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip() for r in rows)


def _tracked(call: Any) -> Optional[str]:
    """Run an MLflow call; a failure (a server gone mid-job) is logged and returned, never raised: the scores
    are in downstream.json whatever MLflow does, and the remaining fine-tunes still run."""
    try:
        call()
    except Exception as exc:  # noqa: BLE001 - any client or server error
        message = f"{type(exc).__name__}: {exc}"[:500]
        log.error("MLflow logging failed, fine-tuning goes on without it: %s", message)
        return message
    return None


def _is_main_process() -> bool:
    # under torchrun / the deepspeed launcher every rank runs this command; one writes the results
    return int(os.environ.get("RANK", "0")) == 0


class Interrupted(KeyboardInterrupt):
    """Ctrl-C during the fine-tunes: `finished` the tasks whose entries `results` (a downstream.json path) holds
    (each written whole when its seeds were done; [] when none finished)."""

    def __init__(self, results: Path, finished: list[str]):
        super().__init__(f"finished {finished} in {results}")
        self.results, self.finished = results, finished


def finetune(args: FinetuneOptions) -> int:
    """Fine-tune and score `args.model` on `args`' tasks over its seeds (the work of `albert-dist finetune`, whose
    flags `albert_dist.cli.finetune` parses into `args`); returns 0.

    Raises:
        ValueError: bad input found before any training (unknown task, missing columns, label sets that differ,
            no tokenizer, a vocabulary mismatch, no such checkpoint step, the hf extra missing, an MLflow store
            that refuses); OSError: unreadable input. The front end prints it as one line, exit 2.
    """
    from albert_dist.job.console import configure_logging

    configure_logging(replace=False)
    from albert_dist.apps.finetune.source import check_vocabulary, describe, resolve

    try:  # the hf extra: transformers (tokenizers, Trainer) and accelerate (which the Trainer needs)
        import accelerate  # noqa: F401
        import transformers  # noqa: F401
    except ImportError as exc:
        raise ValueError(f"{exc.name or exc} is not installed: pip install 'albert_dist[hf]'") from None
    for flag in ("max_train_samples", "max_eval_samples"):
        value = getattr(args, flag)
        if value is not None and value < 1:
            raise ValueError(f"--{flag.replace('_', '-')} must be >= 1, got {value}")
    if len(set(args.seeds)) != len(args.seeds):
        raise ValueError(f"--seeds has duplicates: {args.seeds}")
    with tempfile.TemporaryDirectory(prefix="albert-finetune-src-") as cache:
        # an MLflow run's checkpoint is downloaded into `cache`, read, and removed at the end
        source = resolve(args.model, args.step, args.tracking_uri, Path(cache))
        check_vocabulary(source)
        tasks = load_tasks(args)
        configs = {t.name: finetune_config(args, t.name, source.config.max_position_embeddings) for t in tasks}
        out_dir = Path(args.output) if args.output else source.run_dir
        if out_dir is None:
            raise ValueError(f"{args.model} is not a run directory: pass --output DIR for {RESULTS_FILE}")
        check_task_names(out_dir / RESULTS_FILE, tasks)
        state = source.encoder_state() if args.init == "pretrained" else None
        if state is not None:  # a checkpoint of another size or sharing mode fails here, not mid-run
            from albert_dist.apps.finetune.train import build_model

            build_model(source.config, tasks[0].num_labels, state, 0, 0.0)
        return _run(args, source, tasks, configs, state, out_dir, describe(source))


def _open_tracking(args: FinetuneOptions, source: Any):
    from albert_dist.tracking.finetune_runs import DownstreamRuns
    from albert_dist.tracking.tracker import resolve_tracking_uri

    uri = resolve_tracking_uri(args.tracking_uri or source.tracking_uri)
    standalone = None
    if args.init == "random" or source.parent_run_id is None:
        standalone = f"{Path(str(source.run_dir or args.model)).name}-{args.init}"
    return DownstreamRuns(uri, source.parent_run_id, standalone, args.experiment,
                          tags={"init": args.init, "model": source.description},
                          standalone_params={"init": args.init})


def _run(args: FinetuneOptions, source: Any, tasks: list, configs: dict, state: Any, out_dir: Path,
         described: dict) -> int:
    from tqdm.auto import tqdm

    from albert_dist.apps.finetune.train import build_model, encode, finetune_once, step_bar_callback, steps_per_run

    main = _is_main_process()
    runs = None
    if main and not args.no_tracking:
        try:
            runs = _open_tracking(args, source)
        except Exception as exc:  # noqa: BLE001 - a store that refuses is reported before any training
            raise ValueError(f"MLflow ({args.tracking_uri or source.tracking_uri or 'default store'}): "
                             f"{type(exc).__name__}: {exc}") from None
    step = source.step if args.init == "pretrained" else 0
    world = int(os.environ.get("WORLD_SIZE", "1"))
    prepared = []
    for task in tasks:
        cfg = configs[task.name]
        train = task.train.subset(args.max_train_samples, args.subset_seed)
        dev = task.dev.subset(args.max_eval_samples, args.subset_seed)
        prepared.append((task, cfg, encode(source.tokenizer, train, cfg.max_seq_length),
                         encode(source.tokenizer, dev, cfg.max_seq_length)))
    total = sum(steps_per_run(len(tr), cfg, world) * len(args.seeds) for _, cfg, tr, _ in prepared)
    entries, status, tracking_error = [], "FAILED", None
    try:
        # only the other ranks pass `disable`: on the main one tqdm's own TQDM_* environment (TQDM_DISABLE=1) applies
        with tqdm(total=total, unit="step", desc="finetune", **({} if main else {"disable": True})) as bar:
            for task, cfg, train, dev in prepared:
                per_seed: dict[int, dict[str, float]] = {}
                children: dict[int, str] = {}
                for seed in args.seeds:
                    bar.set_description(f"{task.name} seed {seed}")
                    model = build_model(source.config, task.num_labels, state, seed, cfg.classifier_dropout_prob)
                    scores = finetune_once(model, train, dev, source.tokenizer, task, cfg, seed,
                                           [step_bar_callback(bar)])
                    per_seed[seed] = scores
                    if runs is not None and tracking_error is None:
                        params = {"task": task.name, "seed": seed, "lr": cfg.learning_rate,
                                  "epochs": cfg.num_train_epochs, "batch": cfg.per_device_train_batch_size,
                                  "max_len": cfg.max_seq_length, "warmup_ratio": cfg.warmup_ratio,
                                  "checkpoint_step": step, "init": args.init, "model": source.description,
                                  "train_examples": len(train), "dev_examples": len(dev), "data": task.source}
                        tracking_error = _tracked(lambda: children.__setitem__(seed, runs.log_child(
                            f"{task.name}-{'' if step is None else f'step{step}-'}seed{seed}-{args.init}", params, scores)))
                summary = summarize(per_seed, task.metrics)
                setup = setup_line(task, cfg, len(train), len(dev), args.seeds, args.subset_seed)
                headline: list[bool] = []
                if runs is not None and tracking_error is None:
                    tracking_error = _tracked(lambda: headline.append(runs.log_summary(
                        task.name, {m: s["median"] for m, s in summary.items()}, step or 0, setup)))
                entry = {"task": task.name, "task_identity": task.identity, "init": args.init,
                         "model": source.description, "model_identity": source.identity, "kind": source.kind,
                         "step": step, "data": task.source, "train_examples": len(train), "dev_examples": len(dev),
                         "primary_metric": task.metrics[0], "finetune": dataclasses.asdict(cfg),
                         "subset_seed": args.subset_seed, "seeds": {str(k): v for k, v in per_seed.items()},
                         "summary": summary, "source": described,
                         "mlflow": None if runs is None else {"tracking_uri": runs.tracking_uri,
                                                              "run_id": runs.run_id,
                                                              "children": {str(k): v for k, v in children.items()},
                                                              "headline": bool(headline and headline[0]),
                                                              "error": tracking_error},
                         "finished_utc": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")}
                entries.append(entry)
                if main:
                    write_results(out_dir / RESULTS_FILE, entry)
        status = "FINISHED"
    except KeyboardInterrupt:
        status = "KILLED"  # MLflow's status of a run a user stopped
        raise Interrupted(out_dir / RESULTS_FILE, [e["task"] for e in entries]) from None
    finally:
        if runs is not None and tracking_error is None:
            _tracked(lambda: runs.close(status))
    if main:
        print(format_table(entries))
        print(f"\nresults in {out_dir / RESULTS_FILE}" + (f"; MLflow run {runs.run_id} ({runs.tracking_uri})"
                                                          if runs is not None else ""))
    return 0
