"""Read-ahead of an object store's pieces (albert_dist.data.sources.store.ReadAhead) under a training stream: the batches
are those of the same corpus on local disk, the fetches run ahead of the reader in background threads within
their bound, a resumed loader continues exactly, and a fetched-ahead read is retried (and gives up) under the one
retry policy. The store is fsspec's in-process memory:// filesystem (a URL as s3:// is, no server)."""
from __future__ import annotations

import gc
import random
import threading
import uuid
from collections import Counter
from pathlib import Path

import fsspec
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from albert_dist.data.sources import store
from albert_dist.data.config import SourceConfig
from albert_dist.data.loader import build_train_loader
from fixtures.loader_checks import assert_same, data_cfg, take

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(autouse=True)
def _nothing_fetched_ahead(monkeypatch):
    monkeypatch.setattr(store, "_AHEAD", {})


def _corpus(tmp_path, kind: str):
    """The bundled sample, once on local disk and once under a memory:// URL: ``(local folder, URL folder,
    memory filesystem)``; "parquet": its paragraphs as two shards of 4-row groups (~40 pieces), "txt": its two
    files (32 KB byte ranges: `data_cfg`)."""
    fs = fsspec.filesystem("memory")
    url = f"memory://read-ahead-{uuid.uuid4().hex}"
    (tmp_path / "shards").mkdir()
    for i in range(2):
        sample = REPO / "data" / "sample" / f"wikitext-2-train-0{i}.txt"
        local = tmp_path / "shards" / (f"part-{i}.parquet" if kind == "parquet" else sample.name)
        if kind == "parquet":
            text = sample.read_text(encoding="utf-8")
            docs = [line.strip() for line in text.splitlines() if len(line.strip()) > 200][:80]
            pq.write_table(pa.table({"text": docs}), local, row_group_size=4)
        else:
            local.write_bytes(sample.read_bytes())
        fs.put_file(str(local), f"{url}/{local.name}")
    return tmp_path / "shards", url, fs


@pytest.fixture
def corpus(tmp_path):
    local, url, fs = _corpus(tmp_path, "parquet")
    yield local, url, fs
    fs.rm(url, recursive=True)


def _cfg(path: str, kind: str = "parquet"):
    # not the default budget: a reader handed another policy than its stream's would not take the bytes fetched
    # ahead for it (`store._AHEAD` is keyed by the policy) and fetch them again, which the test below counts
    return data_cfg(0, train=[SourceConfig(paths=[f"{path}/*.{kind}"])], shuffle_documents=4, store_retry_s=120)


@pytest.mark.parametrize("kind", ["parquet", "txt"])
def test_pieces_are_fetched_ahead_within_the_bound_and_a_resume_is_exact(tmp_path, monkeypatch, kind):
    """Every piece's first read (a row group's text chunk, a byte range's first block) is fetched once, in a
    read-ahead thread (a byte range's later reads, for the record past its end, by the reader), never more than
    `READ_AHEAD_PIECES` + 1 pieces' ranges held or in flight; the batches equal the local corpus's; a loader
    dropped mid-way leaves nothing held, and one resumed from a state taken while pieces were fetched ahead (not
    yet read) continues with exactly the local run's next batches."""
    local, url, fs = _corpus(tmp_path, kind)
    reference = take(iter(build_train_loader(_cfg(str(local), kind), 4, rank=1, world_size=2)), 16)

    fetches, held = [], []
    real = type(fs).cat_file

    def spy(self, path, start=None, end=None, **kw):
        fetches.append((threading.current_thread().name, start))
        held.append(len(store._AHEAD))
        return real(self, path, start=start, end=end, **kw)

    monkeypatch.setattr(type(fs), "cat_file", spy)
    first = build_train_loader(_cfg(url, kind), 4, rank=1, world_size=2)
    it = iter(first)
    got = take(it, 8)
    state = first.state_dict()
    assert store._AHEAD  # pieces fetched ahead of the reader, not yet read, when the state was taken
    assert max(held) <= store.READ_AHEAD_PIECES + 1
    del first, it
    gc.collect()
    assert not store._AHEAD  # a loader dropped mid-way holds no bytes
    assert_same(got, reference[:8])
    resumed = build_train_loader(_cfg(url, kind), 4, rank=1, world_size=2)
    resumed.load_state_dict(state)
    assert_same(take(iter(resumed), 8), reference[8:])
    fs.rm(url, recursive=True)

    if kind == "parquet":
        fetches = [(name, start) for name, start in fetches if start > 4]  # not the footers' reads
        # in the reader's thread: only the text-field check of each loader's planning (a row group's first rows)
        assert [name for name, _ in fetches].count("MainThread") == 2, fetches
    ahead = [start for name, start in fetches if name.startswith("read-ahead")]
    assert len(ahead) >= 8, fetches
    # the reader's own fetches (a byte range's later reads, past its first) never repeat one made ahead of it,
    # and each range is fetched once per loader (the first and the resumed one)
    assert not {start for name, start in fetches if name == "MainThread"} & set(ahead), fetches
    assert max(Counter(ahead).values()) <= 2, fetches


def _fake_policy(monkeypatch, budget_s: float) -> store.RetryPolicy:
    now = [1000.0]

    def sleep(seconds: float) -> None:
        now[0] += seconds

    monkeypatch.setattr(store, "COUNTERS", store.Counter())
    return store.RetryPolicy(budget_s=budget_s, clock=lambda: now[0], sleep=sleep, rng=random.Random(0))


def test_a_fetch_ahead_is_retried_and_its_give_up_is_raised_by_the_reader(corpus, monkeypatch):
    """A read-ahead thread's fetch goes through the retry policy: two dropped connections are retried (the reader
    gets the bytes), an outage past the budget is `StoreUnavailable` raised where the reader asks for the bytes,
    naming the URL and the budget."""
    _, url, fs = corpus
    shard = store.expand(f"{url}/*.parquet")[1][0]  # the URL as a listing names it
    meta = pq.read_metadata(fs.open(shard))
    ranges = [[(shard, a, b)] for a, b in
              (store.column_chunk_ranges(meta, g, ["text"])[0] for g in range(3))]
    real = type(fs).cat_file
    failures = [2]

    def flaky(self, path, start=None, end=None, **kw):
        if failures[0] > 0:
            failures[0] -= 1
            raise ConnectionResetError(104, "Connection reset by peer")
        return real(self, path, start=start, end=end, **kw)

    monkeypatch.setattr(type(fs), "cat_file", flaky)
    policy = _fake_policy(monkeypatch, budget_s=60.0)
    ahead = store.ReadAhead(ranges, lambda r: r, depth=2, retry=policy)
    ahead.at(0)
    (path, a, b), = ranges[0]
    assert store.RangedFile(path, retry=policy).fetch(a, b) == real(fs, path, start=a, end=b)
    assert store.COUNTERS["retries"] == 2 and failures == [0]

    failures[0] = 10 ** 6  # down for good; a new reader (the bytes fetched ahead above dropped)
    del ahead
    gc.collect()
    policy = _fake_policy(monkeypatch, budget_s=5.0)
    ahead = store.ReadAhead(ranges, lambda r: r, depth=2, retry=policy)
    ahead.at(1)
    (path, a, b), = ranges[2]
    with pytest.raises(store.StoreUnavailable, match=rf"{path}: read of bytes {a}-{b} kept failing for \d+ s "
                                                     r"\(data.store_retry_s=5\)"):
        store.RangedFile(path, retry=policy).fetch(a, b)
