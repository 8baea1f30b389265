"""The benchmark suite's plumbing (bench/run_all.py, bench/suite/runner.py and report.py, bench/_common.py):
discovery, summaries, the README table, the shared synthetic batch.

No benchmark is timed here; the runner's child processes: tests/integration/test_bench_runner.py.
"""
from __future__ import annotations

import importlib.util
import json
import statistics
import sys
from pathlib import Path

import pytest
import torch

BENCH = Path(__file__).resolve().parents[2] / "bench"


def _load(rel: str):
    sys.path.insert(0, str(BENCH))
    spec = importlib.util.spec_from_file_location(f"bench_{Path(rel).name}_under_test", BENCH / f"{rel}.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


run_all = _load("run_all")
report = _load("suite/report")
runner = _load("suite/runner")
common = _load("_common")


def test_summarize_lists_scalars_and_presummarized():
    s = runner.summarize({"a": [3.0, 1.0, 2.0, 10.0], "b": {"c": 4, "ok": True, "name": "x"},
                           "d": {"min": 1.0, "median": 2.0, "max": 5.0, "n": 7}, "e": [float("nan"), 2.0]})
    assert s["a"] == {"min": 1.0, "median": statistics.median([3.0, 1.0, 2.0, 10.0]), "max": 10.0, "n": 4}
    assert s["b.c"] == {"min": 4.0, "median": 4.0, "max": 4.0, "n": 1}
    assert s["d"] == {"min": 1.0, "median": 2.0, "max": 5.0, "n": 7}
    assert s["e"]["n"] == 1  # NaN dropped
    assert "b.ok" not in s and "b.name" not in s  # booleans and strings are not measurements
    flat = runner.summarize({"x": {"tps_min": 1.0, "tps_median": 2.0, "tps_max": 4.0, "repeats": 3, "tps_median2": 9}})
    assert flat["x.tps"] == {"min": 1.0, "median": 2.0, "max": 4.0, "n": 3}
    assert "x.tps_min" not in flat and flat["x.tps_median2"]["median"] == 9.0


def _results(ratio_values, status="ok"):
    summary = runner.summarize({"ratio_ours_over_hf": ratio_values, "ours_tokens_per_s": [1200.0, 1300.0, 1250.0],
                                 "hf_tokens_per_s": [1000.0, 1010.0, 990.0], "extra_ratio": 0.5})
    return {"wall_s": 12.0, "machine": {"cpu_model": "Test CPU", "cpu_cores_used": 2, "cpu_count": 2,
                                        "memory_gib": 24.0, "date_utc": "2026-01-01T00:00:00Z",
                                        "versions": {"torch": "2.13.0"}, "git_commit": "abc"},
            "benchmarks": {"model_step": {"status": status, "summary": summary},
                           "newbench": {"status": "ok", "summary": runner.summarize({"speed_ratio": [2.0, 4.0]})}}}


def test_table_rows_targets_and_unknown_benchmarks():
    rows = {(r["bench"], r["label"]): r for r in report.rows(_results([1.2, 1.3, 1.25]))}
    ms = next(r for (b, _), r in rows.items() if b == "model_step" and r["ours"])
    assert ms["ratio"]["median"] == 1.25 and ms["met"] is True and ms["target"] == ">= 1.15"
    assert ms["peer"]["median"] == 1000.0
    assert rows[("newbench", "speed_ratio")]["ratio"]["median"] == 3.0  # not in HEADLINES: still shown
    assert all(r["status"] == "not run" for r in rows.values() if r["bench"] == "zero")
    low = next(r for r in report.rows(_results([1.0, 1.1, 1.05])) if r["bench"] == "model_step" and r["ours"])
    assert low["met"] is False
    table = report.render_table(_results([1.2, 1.3, 1.25]))
    assert "| model_step |" in table and "1.25 (1.2–1.3)" in table and "Test CPU" in table
    assert report._fmt(1.1463) == "1.146" and report._fmt(0.04761) == "0.0476" and report._fmt(1.0e6) == "1,000,000"
    assert "n/a (not run)" in table


README = """# proj

## Model
<!-- model section -->
text

## Benchmarks
<!-- bench section -->
How to run.

## Later
keep me
"""


def test_update_readme_inserts_then_replaces_inside_section():
    once = report.update_readme(README, "TABLE-1")
    assert once.index("## Benchmarks") < once.index(report.TABLE_START) < once.index("TABLE-1") < once.index("## Later")
    assert "keep me" in once and "How to run." in once and once.startswith("# proj\n\n## Model")
    twice = report.update_readme(once, "TABLE-2")
    assert "TABLE-1" not in twice and twice.count(report.TABLE_START) == 1 and "TABLE-2" in twice
    assert twice.replace("TABLE-2", "TABLE-1") == once
    with pytest.raises(ValueError, match="Benchmarks"):
        report.update_readme("# no section\n", "T")


DOC = """# Benchmarks

```bash
# a comment in a fenced block is no heading
make bench
```

## GPU check
stays
"""


def test_update_readme_level_one_section_spans_its_subsections():
    """docs/benchmarks.md: the section is the whole file under ``# Benchmarks``; the table goes at its end."""
    once = report.update_readme(DOC, "TABLE-1")
    assert once.startswith(DOC.rstrip("\n")) and once.endswith(f"{report.TABLE_START}\nTABLE-1\n{report.TABLE_END}\n")
    assert report.update_readme(once, "TABLE-2") == once.replace("TABLE-1", "TABLE-2")


def test_bench_doc_holds_the_table():
    """The suite writes its table into docs/benchmarks.md (the README links to it)."""
    doc = (Path(__file__).resolve().parents[2] / "docs" / "benchmarks.md").read_text()
    assert doc.count(report.TABLE_START) == 1 and doc.index(report.TABLE_START) < doc.index(report.TABLE_END)


def test_plot_writes_png(tmp_path):
    path = tmp_path / "r.png"
    assert report.plot(_results([1.2, 1.3, 1.25]), path) == 1
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_discover_searches_bench_and_its_study_folders_but_not_the_runner(tmp_path):
    for rel in ("a.py", "study/b.py", "suite/c.py", "study/_d.py", "run_all.py"):
        (tmp_path / rel).parent.mkdir(exist_ok=True)
        (tmp_path / rel).write_text("def run(repeats=1):\n    return {}\n")
    (tmp_path / "study" / "helper.py").write_text("def main():\n    pass\n")
    assert run_all.discover(tmp_path) == ["a", "b"]
    assert run_all.bench_file("b", tmp_path) == tmp_path / "study" / "b.py"
    (tmp_path / "other").mkdir()
    (tmp_path / "other" / "a.py").write_text("def run():\n    return {}\n")
    with pytest.raises(ValueError, match=r"\['a'\]"):
        run_all.discover(tmp_path)
    found = run_all.discover()  # the real bench/: the convergence study lives in its own folder
    assert {"model_step", "zero", "lamb", "convergence"} <= set(found) and "report" not in found


def test_synthetic_batch_and_stats():
    batch = common.synthetic_batch(vocab_size=100, batch=3, seq=32, predictions=5, seed=1, padded=True)
    assert {k: (tuple(v.shape), v.dtype) for k, v in batch.items()} == {
        **{k: ((3, 32), torch.int64) for k in ("input_ids", "attention_mask", "token_type_ids", "mlm_labels")},
        "sop_labels": ((3,), torch.int64)}
    real = batch["attention_mask"].bool()
    assert real.sum(1).tolist()[0] == 16 and bool((batch["input_ids"][~real] == 0).all())  # one short row, pad 0
    labelled = batch["mlm_labels"] != -100
    assert labelled.sum(1).tolist() == [5, 5, 5] and not labelled[:, 0].any() and not (labelled & ~real).any()
    assert torch.equal(batch["mlm_labels"][labelled], batch["input_ids"][labelled])
    assert bool((batch["input_ids"][real] >= 5).all())  # no special ids among the tokens
    again = common.synthetic_batch(vocab_size=100, batch=3, seq=32, predictions=5, seed=1, padded=True)
    assert all(torch.equal(batch[k], again[k]) for k in batch)
    assert common.stats([3.0, float("nan"), 1.0, 2.0]) == {"min": 1.0, "median": 2.0, "max": 3.0, "n": 3}
    assert common.fmt_stats([1.0, 2.0, 4.0], scale=2.0, digits=1) == "0.5 / 1.0 / 2.0"


def test_mlflow_one_run_per_suite(tmp_path, monkeypatch):
    from mlflow.tracking import MlflowClient

    monkeypatch.chdir(tmp_path)  # a SQLite store puts artifacts under ./mlruns
    uri = f"sqlite:///{tmp_path / 'mlruns.db'}"
    results = _results([1.2, 1.3, 1.25])
    results["machine"].update(gpu=None, python="3.11", versions={"torch": "2.13.0", "deepspeed": None})
    results["benchmarks"]["model_step"].update(wall_s=3.0, kwargs={"repeats": 3})
    results["benchmarks"]["newbench"].update(wall_s=1.0, kwargs={"repeats": 2})
    (tmp_path / "results.json").write_text(json.dumps(results))
    rid = runner.log_to_mlflow(results, uri, "bench-test", [tmp_path / "results.json"])
    run = MlflowClient(tracking_uri=uri).get_run(rid)
    assert run.info.status == "FINISHED"
    assert run.data.metrics["model_step/ratio_ours_over_hf/median"] == 1.25
    assert run.data.metrics["model_step/ratio_ours_over_hf/max"] == 1.3
    assert run.data.metrics["suite/wall_s"] == 12.0
    assert run.data.params["model_step.repeats"] == "3" and run.data.params["cpu_model"] == "Test CPU"
    assert run.data.tags["status.newbench"] == "ok"
    assert [a.path for a in MlflowClient(tracking_uri=uri).list_artifacts(rid)] == ["results.json"]


def test_write_block_replaces_only_between_its_markers_and_refuses_a_doc_without_them(tmp_path):
    """The one way a bench script writes figures into a doc: the hand-written prose around the markers stays."""
    doc = tmp_path / "d.md"
    doc.write_text("intro\n<!-- x figures start -->\nold\n<!-- x figures end -->\nprose\n")
    common.write_block(doc, "x figures", "| a |\n| 1 |")
    assert doc.read_text() == "intro\n<!-- x figures start -->\n| a |\n| 1 |\n<!-- x figures end -->\nprose\n"
    with pytest.raises(ValueError, match="expected one <!-- y figures start -->"):
        common.write_block(doc, "y figures", "z")
