"""Two jobs starting at once on a new local SQLite store: without a lock MLflow's schema creation runs twice and
the second job fails ("table registered_models already exists": 4 of 4 tries on this machine); with
`create_local_store` both open the store."""
from __future__ import annotations

import multiprocessing as mp

import pytest

pytest.importorskip("mlflow")


def _open(uri: str, barrier, results, lock: bool) -> None:
    from mlflow import MlflowClient

    from albert_dist.tracking.tracker import create_local_store

    barrier.wait()
    try:
        if lock:
            create_local_store(uri)
        MlflowClient(uri).get_experiment_by_name("pretrain")
        results.put("ok")
    except Exception as exc:  # noqa: BLE001 - the result is what the test compares
        results.put(f"{type(exc).__name__}: {exc}"[:200])


def _race(uri: str, lock: bool) -> list[str]:
    ctx = mp.get_context("spawn")  # no MLflow state shared through fork
    barrier, results = ctx.Barrier(2), ctx.Queue()
    procs = [ctx.Process(target=_open, args=(uri, barrier, results, lock)) for _ in range(2)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(timeout=120)
    return sorted(results.get(timeout=5) for _ in procs)


@pytest.mark.integration
def test_two_jobs_creating_one_new_store_both_open_it(tmp_path):
    assert _race(f"sqlite:///{tmp_path / 'a' / 'mlruns.db'}", lock=True) == ["ok", "ok"]
    assert not list((tmp_path / "a").glob("*.lock"))  # the lock is on the directory: nothing left beside the store
