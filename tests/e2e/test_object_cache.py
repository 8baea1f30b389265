"""The node cache of object-store validation sources (albert_dist.data.sources.cache) against a real S3 server (moto's).

Every read goes through a counting proxy in front of the server (tests/fixtures/s3_server.py `FaultProxy` with
``every=0``), so "0 remote bytes" is the server's side of the count, not only our own counters. The reference for
the validation set is the same file on local disk, built by the same code.
"""
from __future__ import annotations

import hashlib
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from albert_dist.data.sources import cache, store
from albert_dist.data.config import DataConfig, SourceConfig
from albert_dist.data.tokenizer import load_tokenizer
from albert_dist.data.validation import build_validation_set

pytestmark = pytest.mark.e2e

REPO = Path(__file__).resolve().parents[2]
SAMPLE = REPO / "data" / "sample"
CLIENT = REPO / "tests" / "fixtures" / "cache_client.py"


@pytest.fixture
def proxy(s3_server, monkeypatch):
    """A counting proxy in front of the test's S3 server, with the environment pointing s3fs at it."""
    from fixtures.s3_server import FaultProxy, _clear_fsspec

    p = FaultProxy(s3_server.endpoint, every=0).start()
    monkeypatch.setenv("AWS_ENDPOINT_URL", p.endpoint)
    _clear_fsspec()
    yield p
    p.stop()


def _put(s3_server, url: str, data: bytes) -> None:
    bucket, _, key = url[len("s3://"):].partition("/")
    s3_server.client().put_object(Bucket=bucket, Key=key, Body=data)


def _forget_listings() -> None:
    """What a new process knows: no object sizes/versions (the next read lists the store again)."""
    store._STAT.clear()


def _valset(validation: str, cache_dir: Path, sp, max_bytes: int = 1 << 30):
    cfg = DataConfig(validation=[SourceConfig(paths=[validation])], eval_examples=48, max_seq_length=64,
                     cache_dir=str(cache_dir), cache_max_bytes=max_bytes)
    return build_validation_set(cfg, sp).batch


def test_a_validation_set_from_s3_is_the_local_one_and_a_second_build_reads_0_remote_bytes(s3_server, proxy,
                                                                                          tmp_path):
    sp = load_tokenizer(str(SAMPLE / "spiece.model"))
    local = SAMPLE / "wikitext-2-validation.txt"
    s3_server.bucket("val")
    _put(s3_server, "s3://val/wikitext-2-validation.txt", local.read_bytes())
    reference = _valset(str(local), tmp_path / "unused", sp)

    first = _valset("s3://val/wikitext-2-validation.txt", tmp_path / "cache", sp)
    size = local.stat().st_size
    assert proxy.served["ranged_get_bytes"] == size == store.COUNTERS["bytes_requested"]  # one download, whole
    assert store.COUNTERS["cache_misses"] == 1 and store.COUNTERS["cache_hits"] == 0
    before = dict(proxy.served)
    _forget_listings()  # the next rank / the next job
    second = _valset("s3://val/wikitext-2-validation.txt", tmp_path / "cache", sp)
    assert proxy.served["ranged_get_bytes"] == before["ranged_get_bytes"]  # the server sent no object byte
    assert store.COUNTERS["bytes_requested"] == size and store.COUNTERS["cache_hits"] == 1
    for got in (first, second):
        assert got.keys() == reference.keys()
        assert all(torch.equal(got[k], reference[k]) for k in reference)

    # turned off (data.cache_max_bytes=0): read from the store by ranges, as before, the same set
    third = _valset("s3://val/wikitext-2-validation.txt", tmp_path / "cache", sp, max_bytes=0)
    assert proxy.served["ranged_get_bytes"] > before["ranged_get_bytes"]
    assert all(torch.equal(third[k], reference[k]) for k in reference)


def test_a_changed_object_is_fetched_again(s3_server, proxy, tmp_path):
    s3_server.bucket("val")
    url = "s3://val/a.txt"
    objects = cache.ObjectCache(str(tmp_path), 1 << 20)
    for content in (b"first version\n" * 100, b"second, longer version\n" * 100, b"third  version\n" * 100):
        _put(s3_server, url, content)  # the third has the first's size: only the ETag tells them apart
        _forget_listings()
        sent = proxy.served["ranged_get_bytes"]
        with objects.pin([url]) as copies:
            assert Path(copies[url]).read_bytes() == content
        assert proxy.served["ranged_get_bytes"] - sent == len(content)
    assert store.COUNTERS["cache_misses"] == 3


def test_the_bound_holds_and_evicts_the_least_recently_used_entry_not_in_use(s3_server, proxy, tmp_path):
    s3_server.bucket("val")
    urls = {name: f"s3://val/{name}.txt" for name in "abcd"}
    for name, url in urls.items():
        _put(s3_server, url, name.encode() * 1000)
    objects = cache.ObjectCache(str(tmp_path), 2500)  # room for two objects of 1000 bytes

    def cached() -> set[str]:
        return {Path(p).name.split("-", 1)[1][0] for _, p, _ in objects.entries()}

    for name in "ab":
        with objects.pin([urls[name]]):
            pass
    time.sleep(0.01)
    with objects.pin([urls["a"]]):  # a hit: a is now the most recently used
        pass
    with objects.pin([urls["c"]]) as copies:
        assert Path(copies[urls["c"]]).read_bytes() == b"c" * 1000
    assert cached() == {"a", "c"}  # b, the least recently used, was evicted
    # both entries in use: no room for d, which is then read from the store (not cached), and nothing is evicted
    with objects.pin([urls["a"], urls["c"]]), objects.pin([urls["d"]]) as copies:
        assert copies == {}
    assert cached() == {"a", "c"}
    assert sum(nbytes for _, _, nbytes in objects.entries()) <= 2500
    # larger than the whole bound: never cached
    _put(s3_server, "s3://val/big.txt", b"x" * 3000)
    with objects.pin(["s3://val/big.txt"]) as copies:
        assert copies == {}


def _client(root: Path, url: str, go: Path, block_bytes: int, env: dict) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, str(CLIENT), str(root), str(1 << 30), str(block_bytes), url, str(go)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)


def test_two_processes_racing_on_one_entry_download_it_once_and_both_read_the_right_bytes(s3_server, proxy,
                                                                                           tmp_path):
    s3_server.bucket("val")
    content = os.urandom(256 << 10)
    _put(s3_server, "s3://val/race.bin", content)
    proxy.delay_s = 0.03  # 8 blocks of 32 KiB: ~0.25 s of download, during which the other client arrives
    go = tmp_path / "go"
    env = {**os.environ, "AWS_ENDPOINT_URL": proxy.endpoint, "PYTHONPATH": str(REPO)}
    clients = [_client(tmp_path / "cache", "s3://val/race.bin", go, 32 << 10, env) for _ in range(2)]
    deadline = time.monotonic() + 60
    while len(list(tmp_path.glob("go.ready.*"))) < 2:  # both imported: the go file starts them together
        assert all(c.poll() is None for c in clients) and time.monotonic() < deadline
        time.sleep(0.01)
    go.touch()
    results = []
    for c in clients:
        out, err = c.communicate(timeout=60)
        assert c.returncode == 0, err
        results.append(json.loads(out.strip().splitlines()[-1]))
    assert all(r["sha256"] == hashlib.sha256(content).hexdigest() for r in results)
    assert proxy.served["ranged_get_bytes"] == len(content)  # downloaded once, by one of them
    assert sorted((r["cache_misses"], r["cache_hits"], r["bytes_requested"]) for r in results) == [
        (0, 1, 0), (1, 0, len(content))]


def test_a_download_killed_midway_leaves_no_entry_and_its_temporary_is_cleaned(s3_server, proxy, tmp_path):
    s3_server.bucket("val")
    content = os.urandom(256 << 10)
    url = "s3://val/killed.bin"
    _put(s3_server, url, content)
    proxy.delay_s = 0.15  # 8 blocks: ~1.2 s of download; killed after the first, >= 1 s before it could end
    go = tmp_path / "go"
    go.touch()
    root = tmp_path / "cache"
    env = {**os.environ, "AWS_ENDPOINT_URL": proxy.endpoint, "PYTHONPATH": str(REPO)}
    client = _client(root, url, go, 32 << 10, env)
    deadline = time.monotonic() + 30
    while not list(root.glob("*.part")) or proxy.served["ranged_gets"] < 1:
        assert client.poll() is None and time.monotonic() < deadline, client.stderr.read() if client.poll() else ""
        time.sleep(0.01)
    client.send_signal(signal.SIGKILL)
    client.wait(timeout=30)
    parts = list(root.glob("*.part"))
    assert len(parts) == 1 and not [p for p in root.iterdir() if p.name.endswith("-killed.bin")]  # no entry
    proxy.delay_s = 0.0
    objects = cache.ObjectCache(str(root), 1 << 30)
    _put(s3_server, "s3://val/other.txt", b"other")
    with objects.pin(["s3://val/other.txt"]):  # any miss runs the cleaning rule first: the dead download's
        pass                                    # temporary (its lock free) is removed
    assert not parts[0].exists() and not list(root.glob("*.part"))
    with objects.pin([url]) as copies:  # and the object is downloaded afresh, whole
        assert Path(copies[url]).read_bytes() == content
    assert store.COUNTERS["cache_misses"] == 2
