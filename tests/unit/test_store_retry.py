"""The object store's one retry policy (albert_dist.data.sources.store.RetryPolicy, `call`) on a fake clock and a fake
client (no sleeping), handed to what reads rather than set for the process (two streams of one process keep their
own ``data.store_retry_s``), and what a training stream does when the policy gives up (`StoreUnavailable` reaches
the training process as itself, and the loader's state before it resumes exactly)."""
from __future__ import annotations

import dataclasses
import logging
import random
import re
import time
import uuid
from pathlib import Path

import fsspec
import pytest

from albert_dist.data.sources import store
from albert_dist.data import stream as stream_mod
from albert_dist.data.config import DataConfig, SourceConfig
from albert_dist.data.loader import STORE_UNAVAILABLE, PretrainingStream, build_train_loader, next_batch
from fixtures.loader_checks import assert_same, data_cfg, take

REPO = Path(__file__).resolve().parents[2]

URL = "s3://bucket/shard-00.parquet"


class FakeClock:
    """Time that moves only when the code under test sleeps (or a fake request takes ``request_s``); ``policy``:
    a 300 s `store.RetryPolicy` on it."""

    def __init__(self) -> None:
        self.now, self.sleeps = 1000.0, []
        self.policy = store.RetryPolicy(budget_s=300.0, clock=self.clock, sleep=self.sleep, rng=random.Random(0))

    def clock(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.sleeps.append(seconds)
        self.now += seconds


class FlakyClient:
    """A client call that fails with ``error`` until the fake clock reaches ``until`` (an outage), then answers."""

    def __init__(self, clock: FakeClock, until: float, error: Exception, request_s: float = 0.05) -> None:
        self.clock, self.until, self.error, self.request_s = clock, until, error, request_s
        self.calls = 0

    def get(self, start: int, end: int) -> bytes:
        self.calls += 1
        self.clock.now += self.request_s
        if self.clock.now < self.until:
            raise self.error
        return bytes(end - start)


@pytest.fixture
def fake(monkeypatch) -> FakeClock:
    monkeypatch.setattr(store, "COUNTERS", store.Counter())
    return FakeClock()


def test_an_outage_shorter_than_the_budget_is_outlasted(fake, caplog):
    """A 30 s outage (connection refused) inside a 300 s budget: the read returns the bytes; the waits grow
    exponentially, each drawn at random below its cap (full jitter), and each retry is one warning naming the URL."""
    client = FlakyClient(fake, until=fake.now + 30.0, error=ConnectionRefusedError(111, "Connection refused"))
    with caplog.at_level(logging.WARNING, logger="albert_dist.data.sources.store"):
        assert store.call(URL, "read of bytes 0-4", client.get, 0, 4, retry=fake.policy) == bytes(4)
    n = len(fake.sleeps)
    assert client.calls == n + 1 and store.COUNTERS["retries"] == n
    caps = [min(20.0, 0.5 * 2 ** i) for i in range(n)]
    assert all(0 <= s <= cap for s, cap in zip(fake.sleeps, caps)), (fake.sleeps, caps)
    assert len(set(fake.sleeps)) == n  # jittered: no two waits alike
    assert sum(fake.sleeps) + client.calls * 0.05 >= 30.0  # it waited the outage out, no more than a wait past it
    assert sum(fake.sleeps[:-1]) < 30.0
    warnings = [r.getMessage() for r in caplog.records]
    assert len(warnings) == n and all(w.startswith(f"{URL}: read of bytes 0-4 failed (attempt ") for w in warnings)
    assert "ConnectionRefusedError" in warnings[0] and "data.store_retry_s=300" in warnings[0]


def test_an_outage_longer_than_the_budget_raises_store_unavailable_within_it(fake):
    """The budget is the time from the first attempt to the last one (the last wait cut to end with it); the error is
    one line naming the URL, the operation, the budget and the last error; neither a ValueError (exit 2: bad
    input) nor an OSError (a reader would take it for a damaged piece and skip the rest of it)."""
    start = fake.now
    client = FlakyClient(fake, until=float("inf"), error=TimeoutError("read timed out"))
    with pytest.raises(store.StoreUnavailable) as info:
        store.call(URL, "read of bytes 0-4", client.get, 0, 4, retry=fake.policy)
    assert 300.0 <= fake.now - start <= 300.0 + client.request_s  # the last attempt when the budget ended
    assert max(fake.sleeps) <= 20.0 and client.calls >= 15
    text = str(info.value)
    assert "\n" not in text and text.startswith(f"{URL}: read of bytes 0-4 kept failing for ")
    assert "data.store_retry_s=300" in text and text.endswith("TimeoutError: read timed out")
    assert not isinstance(info.value, (ValueError, OSError))


@pytest.mark.parametrize("error", [FileNotFoundError(2, "NoSuchKey"), PermissionError(13, "AccessDenied")])
def test_a_missing_or_denied_object_is_not_retried(fake, error):
    client = FlakyClient(fake, until=float("inf"), error=error)
    with pytest.raises(store.StoreError, match=f"^{URL}: "):
        store.call(URL, "read", client.get, 0, 4, retry=fake.policy)
    assert client.calls == 1 and fake.sleeps == []


def test_a_call_honours_the_budget_it_is_handed_and_the_config_validates_it(fake):
    policy = dataclasses.replace(fake.policy, budget_s=12.5)
    client = FlakyClient(fake, until=float("inf"), error=ConnectionResetError(104, "reset"))
    with pytest.raises(store.StoreUnavailable, match=r"data\.store_retry_s=12\.5"):
        store.call(URL, "list", client.get, 0, 1, retry=policy)
    assert sum(fake.sleeps) <= 12.5
    for bad in (0, -1.0):
        with pytest.raises(ValueError, match=rf"^data\.store_retry_s must be > 0 \(seconds\), got {bad}"):
            DataConfig(store_retry_s=bad)
        with pytest.raises(ValueError, match="data.store_retry_s must be > 0"):
            store.RetryPolicy(budget_s=bad)
    # a command without a recipe reads under the config's default budget
    assert DataConfig().store_retry_s == store.DEFAULT_RETRY.budget_s == 300.0


def test_the_store_holds_no_policy_a_caller_sets(monkeypatch, caplog):
    """No setter, and no module name a call reads its policy from: a policy bound to every RetryPolicy-valued name
    of the store (as `configure` once rebound ``POLICY`` for the whole process) changes nothing; a call without
    ``retry`` keeps the default budget (one transient failure: one real wait of at most 0.5 s)."""
    assert [name for name in ("configure", "POLICY") if hasattr(store, name)] == []
    for name, value in list(vars(store).items()):
        if isinstance(value, store.RetryPolicy):
            monkeypatch.setattr(store, name, store.RetryPolicy(budget_s=1.0))
    failures = [1]

    def once(start: int, end: int) -> bytes:
        if failures.pop() if failures else 0:
            raise ConnectionResetError(104, "reset")
        return bytes(end - start)

    with caplog.at_level(logging.WARNING, logger="albert_dist.data.sources.store"):
        assert store.call(URL, "read", once, 0, 4) == bytes(4)
    assert [r.getMessage() for r in caplog.records if "data.store_retry_s=300:" in r.getMessage()] != []


def _outage(monkeypatch, prefixes: tuple[str, ...]) -> None:
    """Every list and read of a memory:// object under ``prefixes`` fails as a dropped connection does."""
    mem = type(fsspec.filesystem("memory"))
    real_cat, real_glob = mem.cat_file, mem.glob

    def down(path: str) -> None:
        if any(str(path).lstrip("/").startswith(p) for p in prefixes):
            raise ConnectionResetError(104, "Connection reset by peer")

    def cat_file(self, path, start=None, end=None, **kw):
        down(path)
        return real_cat(self, path, start=start, end=end, **kw)

    def glob(self, path, **kw):
        down(path)
        return real_glob(self, path, **kw)

    monkeypatch.setattr(mem, "cat_file", cat_file)
    monkeypatch.setattr(mem, "glob", glob)


def test_two_streams_of_one_process_keep_their_own_retry_budget(monkeypatch):
    """Two training streams of one process (0 workers), one with data.store_retry_s=0.2 and one with 0.6, each over
    its own memory:// copy of a sample file: both read a batch, then the store goes down. Each gives up after its
    own budget, naming it; a stream planned during the outage plans under its own too. (A process-wide policy,
    set by the last stream to start iterating, gave the first one the second one's budget.)"""
    monkeypatch.setattr(store, "_AHEAD", {})
    fs = fsspec.filesystem("memory")
    roots = tuple(f"policy-{name}-{uuid.uuid4().hex}" for name in ("a", "b"))
    for root in roots:
        fs.pipe_file(f"/{root}/part.txt", (REPO / "data/sample/wikitext-2-train-04.txt").read_bytes()[:24 << 10])

    def cfg(root: str, budget_s: float) -> DataConfig:
        return data_cfg(0, train=[SourceConfig(paths=[f"memory://{root}/*.txt"])], store_retry_s=budget_s)

    try:
        streams = {budget: iter(PretrainingStream(cfg(root, budget), "train", 8, rank=0, world_size=1))
                   for root, budget in zip(roots, (0.2, 0.6))}
        for it in streams.values():
            assert "input_ids" in next(it)
        deadline = time.monotonic() + 30
        while not all(f.done() for f in store._AHEAD.values()) and time.monotonic() < deadline:
            time.sleep(0.01)  # what each stream fetched ahead before the outage is in: its later reads are new calls
        _outage(monkeypatch, roots)
        for budget, it in streams.items():
            t0 = time.monotonic()
            batch = next(b for b in it if STORE_UNAVAILABLE in b)  # the epoch's fetched bytes first, then the outage
            assert re.search(rf"kept failing for \d s \(data\.store_retry_s={budget:g}\): ConnectionResetError",
                             batch[STORE_UNAVAILABLE]), batch
            assert time.monotonic() - t0 < budget + 5
        with pytest.raises(store.StoreUnavailable, match=rf"memory://{roots[0]}/\*\.txt: list kept failing for 0 s "
                                                         r"\(data\.store_retry_s=0\.3\)"):
            PretrainingStream(cfg(roots[0], 0.3), "train", 8, rank=0, world_size=1)
    finally:
        for root in roots:
            fs.rm(f"/{root}", recursive=True)


def test_a_stream_that_gives_up_raises_in_the_trainer_and_its_state_resumes_exactly(monkeypatch):
    """The stream's read gives up on the store in the middle of a window (0 workers here; a worker process is
    tests/e2e/test_object_store_outage.py): `next_batch` raises `StoreUnavailable` with the reader's one line,
    the loader yields nothing after it, and the loader's state taken before that batch resumes to exactly the
    batches an uninterrupted run gives."""
    cfg = data_cfg(0, shuffle_documents=2)
    real = stream_mod.read_piece
    records = 0

    def outage_after_300_records(piece, *args, **kwargs):
        nonlocal records
        for rec in real(piece, *args, **kwargs):
            records += 1
            if records > 5:  # in the third shuffle window (2 documents each)
                raise store.StoreUnavailable(f"{piece['path']}: read of bytes 0-9 kept failing for 300 s")
            yield rec

    monkeypatch.setattr(stream_mod, "read_piece", outage_after_300_records)
    loader = build_train_loader(cfg, 8, rank=0, world_size=1)
    it = iter(loader)
    got, state = [], loader.state_dict()
    with pytest.raises(store.StoreUnavailable, match=r"wikitext-2-train-0\d\.txt: read of bytes 0-9 kept failing"):
        while True:
            state = loader.state_dict()
            got.append(next_batch(it))
    monkeypatch.setattr(stream_mod, "read_piece", real)  # the store is back
    reference = take(iter(build_train_loader(cfg, 8, rank=0, world_size=1)), len(got) + 5)
    assert 0 < len(got)
    assert_same(got, reference[:len(got)])
    with pytest.raises(StopIteration):
        next(it)

    resumed = build_train_loader(cfg, 8, rank=0, world_size=1)
    resumed.load_state_dict(state)
    assert_same(got + take(iter(resumed), 5), reference)


def test_a_command_whose_store_stays_down_is_one_line_and_exit_75(monkeypatch, capsys):
    """`albert-dist data plan` on an s3:// source whose endpoint refuses every connection, with a 1 s budget
    (``data.store_retry_s``, read from the recipe): one line naming the URL and the budget, exit 75 (try again),
    neither a traceback nor the bad-input exit 2."""
    from fixtures.s3_server import CREDENTIALS, _clear_fsspec
    from helpers import free_port

    from albert_dist.cli import main as cli_main

    for key, value in {**CREDENTIALS, "AWS_ENDPOINT_URL": f"http://127.0.0.1:{free_port()}",
                       "AWS_CONFIG_FILE": "/dev/null", "AWS_SHARED_CREDENTIALS_FILE": "/dev/null"}.items():
        monkeypatch.setenv(key, value)
    _clear_fsspec()
    try:
        code = cli_main(["data", "plan", "--config", "configs/pretrain/albert-tiny-wikitext.yaml", "--ranks", "2",
                         "data.train=[s3://down/corpus/*.parquet]", "data.store_retry_s=1"])
    finally:
        _clear_fsspec()
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 75
    # the one error line last; before it at most the logged retries (where a handler left by an earlier test in
    # this process prints them; pytest's capture takes them otherwise) and botocore's INFO lines, never a traceback
    assert err[-1].startswith("albert-dist data plan: s3://down/corpus/*.parquet: list kept failing")
    assert "data.store_retry_s=1" in err[-1]
    assert not [line for line in err[:-1] if "list failed (attempt" not in line and "botocore" not in line
                and not line.startswith("[rank0 ") or "Traceback" in line]
