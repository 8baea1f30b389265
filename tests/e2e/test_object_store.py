"""Corpora in an object store, against a real S3 HTTP server (moto's, tests/fixtures/s3_server.py).

The reference is always the same files on local disk, read by the same code (the deterministic local path the
other data tests check against independent references): a URL source must give exactly the same documents, in
the same slots and order, for txt, .jsonl.zst and parquet; `data prepare` from s3:// to s3:// must write the
same shards (sha256) as a local prepare of the same files; reads must be ranged (bytes requested / bytes used
counted by albert_dist.data.sources.store); transient faults retried without losing or repeating a document; a missing
bucket, object or credentials must be one line naming the URL.
"""
from __future__ import annotations

import json
import logging
import re
from collections import Counter
from pathlib import Path

import pytest

from albert_dist.data.prepare import options, publish, run
from albert_dist.data.sources import store
from albert_dist.data.config import SourceConfig
from albert_dist.data.sources.read import read_piece
from albert_dist.data.sources.discover import slot_shares
from albert_dist.data.stream import SourceStream, iter_texts, pieces_of

pytestmark = pytest.mark.e2e

REPO = Path(__file__).resolve().parents[2]
SAMPLE = REPO / "data" / "sample"
PIECE = 64 << 10


def _documents() -> list[str]:
    """Real WikiText paragraphs (the lines of two bundled shards), the corpus every format below is written from."""
    text = "".join((SAMPLE / f"wikitext-2-train-0{i}.txt").read_text(encoding="utf-8") for i in range(2))
    return [d.strip() for d in text.splitlines() if d.strip()]


@pytest.fixture(scope="module")
def local_corpus(tmp_path_factory) -> dict[str, Path]:
    """The same documents as .txt, .jsonl.zst and parquet (row groups of 100 rows) in three local folders."""
    import pyarrow as pa
    import pyarrow.parquet as pq
    import zstandard

    docs = _documents()
    root = tmp_path_factory.mktemp("corpus")
    out = {}
    for kind in ("txt", "jsonl.zst", "parquet"):
        folder = root / kind.replace(".", "-")
        folder.mkdir()
        half = len(docs) // 2
        for i, part in enumerate((docs[:half], docs[half:])):
            path = folder / f"part-{i}.{kind}"
            if kind == "txt":
                path.write_text("\n\n".join(part) + "\n", encoding="utf-8")
            elif kind == "jsonl.zst":
                data = "".join(json.dumps({"text": d}) + "\n" for d in part).encode()
                path.write_bytes(zstandard.ZstdCompressor().compress(data))
            else:
                pq.write_table(pa.table({"text": part}), path, row_group_size=100, compression="zstd")
        out[kind] = folder
    return out


def _slot_documents(source: SourceConfig, slots: int, retry=store.DEFAULT_RETRY) -> list[list[str]]:
    """Each slot's records (text or skip marker) in the order its stream reads them, unshuffled."""
    pieces = pieces_of(source, "t", PIECE, slots, retry=retry)
    out = []
    for slot in range(slots):
        docs = []
        for i, k, j in slot_shares(len(pieces), slots, slot):
            docs += [r["text"] or r["skip"]
                     for r in read_piece(pieces[i], "text", "blank_line", 1 << 20, (k, j), retry=retry)]
        out.append(docs)
    return out


@pytest.mark.parametrize("kind", ["txt", "jsonl.zst", "parquet"])
def test_a_url_source_reads_exactly_what_the_local_files_hold(kind, local_corpus, s3_server):
    folder = local_corpus[kind]
    s3_server.bucket("raw")
    s3_server.upload(folder, "s3://raw/corpus")
    local = SourceConfig(paths=[str(folder / f"*.{kind}")])
    remote = SourceConfig(paths=[f"s3://raw/corpus/*.{kind}"])
    docs = list(iter_texts([local], "t", 1 << 20))
    assert len(docs) > 500 and docs == _documents()
    assert list(iter_texts([remote], "t", 1 << 20)) == docs
    # every slot of a 4-slot job reads the same records from the bucket as from disk
    assert _slot_documents(remote, 4) == _slot_documents(local, 4)
    # the shuffled per-slot stream the loader cycles: the same documents in the same order
    for src_pair in [(local, remote)]:
        streams = [SourceStream(s, "t", pieces_of(s, "t", PIECE, 4), 1, 4, seed=3, shuffle=True,
                                max_document_bytes=1 << 20) for s in src_pair]
        assert [streams[0].next_document() for _ in range(60)] == [streams[1].next_document() for _ in range(60)]
    # a prefix ("directory") names the same objects as the glob
    assert list(iter_texts([SourceConfig(paths=["s3://raw/corpus"])], "t", 1 << 20)) == docs


def test_prepare_s3_to_s3_then_plan_and_read_back(local_corpus, s3_server, tmp_path, monkeypatch):
    from albert_dist.config import load_config
    from albert_dist.data.sources.pieces import job_sources

    monkeypatch.setenv("ALBERT_DIST_PREPARE_TMP", str(tmp_path / "work"))
    s3_server.bucket("raw")
    s3_server.bucket("prepared")
    s3_server.upload(local_corpus["jsonl.zst"], "s3://raw/pile")

    def opts(inputs: str, output: str) -> options.PrepareOptions:
        return options.PrepareOptions(sources=[SourceConfig(paths=[inputs])], output=output, num_shards=2,
                                   row_group_bytes=64 << 10, tokenizer_path=None, progress=False)

    ref = run.prepare(opts(str(local_corpus["jsonl.zst"] / "*.jsonl.zst"), str(tmp_path / "local-out")), "ref")
    got = run.prepare(opts("s3://raw/pile/*.jsonl.zst", "s3://prepared/train"), "s3")
    # the same shards, byte for byte, and the manifest in the bucket is the one returned
    assert [(e["path"], e["sha256"]) for e in got["files"]] == [(e["path"], e["sha256"]) for e in ref["files"]]
    assert publish.load_manifest("s3://prepared/train") == json.loads(json.dumps(got))
    keys = sorted(o["Key"] for o in s3_server.client().list_objects_v2(Bucket="prepared")["Contents"])
    assert keys == sorted(["train/manifest.json"] + [f"train/{e['path']}" for e in got["files"]])
    assert [p.suffix for p in (tmp_path / "work").iterdir()] == [".lock"]  # local work removed, the lock kept
    # a rerun is a no-op
    with pytest.raises(run.AlreadyComplete):
        run.prepare(opts("s3://raw/pile/*.jsonl.zst", "s3://prepared/train"), "s3")
    # `data plan` from metadata, with the source given as a plain URL in an override
    cfg = load_config(None, ["data.train=[s3://prepared/train]", "data.validation=[]", "tracking.enabled=false"])
    assert cfg.data.train[0].paths == ["s3://prepared/train"]
    (plan,) = job_sources(cfg.data, 2, 2)
    assert plan.manifest == "s3://prepared/train/manifest.json"
    assert plan.documents == got["documents"] and plan.pieces == got["row_groups"]
    # read back: the documents the local output holds
    local_docs = list(iter_texts([SourceConfig(paths=[str(tmp_path / "local-out")])], "t", 1 << 20))
    assert list(iter_texts(cfg.data.train, "t", 1 << 20)) == local_docs and len(local_docs) == got["documents"]


def test_reads_are_ranged_and_counted(local_corpus, s3_server, tmp_path, monkeypatch):
    """A slot of 16 reads only its row groups' text chunks, not the objects (footers: parsed once by planning)."""
    monkeypatch.setenv("ALBERT_DIST_PREPARE_TMP", str(tmp_path / "work"))
    s3_server.bucket("prepared")
    run.prepare(options.PrepareOptions(sources=[SourceConfig(paths=[str(local_corpus["txt"])])],
                                     output="s3://prepared/wt", num_shards=2, row_group_bytes=16 << 10,
                                     tokenizer_path=None, progress=False), "t")
    source = SourceConfig(paths=["s3://prepared/wt"])
    pieces = pieces_of(source, "t", PIECE, 16)
    assert len(pieces) >= 16
    store.COUNTERS.clear()  # footers are parsed (and cached) by planning; count the reads of slot 5 alone
    used = 0
    for i, k, j in slot_shares(len(pieces), 16, 5):
        used += pieces[i]["nbytes"]
        assert any(not r["skip"] for r in read_piece(pieces[i], "text", "blank_line", 1 << 20, (k, j)))
    total = sum(store.file_size(p) for p in {pc["path"] for pc in pieces})
    assert 0 < store.COUNTERS["bytes_requested"] <= 1.1 * used < total / 8


def test_transient_faults_are_retried_without_losing_a_document(local_corpus, s3_server, monkeypatch, caplog):
    """Through a proxy that spoils every third ranged GET in turn — a 503 SlowDown, a connection dropped half-way
    through the body, an answer held back past the client's read timeout — every slot still reads exactly the
    local files' records (s3fs/botocore's own retries and ours, from the same offset)."""
    import fsspec.config
    from fixtures.s3_server import FaultProxy, _clear_fsspec

    quick = store.RetryPolicy(first_backoff_s=0.01, max_backoff_s=0.02)
    s3_server.bucket("raw")
    s3_server.upload(local_corpus["txt"], "s3://raw/corpus")
    s3_server.upload(local_corpus["parquet"], "s3://raw/parquet")
    proxy = FaultProxy(s3_server.endpoint, every=3, stall_s=2.0).start()
    try:
        monkeypatch.setenv("AWS_ENDPOINT_URL", proxy.endpoint)
        # a short read timeout (a real deployment keeps botocore's 60 s) so the stalled answer times out
        monkeypatch.setitem(fsspec.config.conf, "s3", {"config_kwargs": {"read_timeout": 0.5, "connect_timeout": 2}})
        _clear_fsspec()
        with caplog.at_level(logging.WARNING):
            for folder, pattern in ((local_corpus["txt"], "corpus/*.txt"), (local_corpus["parquet"], "parquet")):
                got = _slot_documents(SourceConfig(paths=[f"s3://raw/{pattern}"]), 4, quick)
                assert got == _slot_documents(SourceConfig(paths=[str(folder)]), 4)
    finally:
        proxy.stop()
    assert all(proxy.faults[kind] >= 2 for kind in FaultProxy.KINDS), proxy.faults
    # one retry layer (albert_dist.data.sources.store.call), bounded, each retry a warning with its attempt count
    assert store.COUNTERS["retries"] == sum(proxy.faults.values())
    warnings = [r.getMessage() for r in caplog.records if "retrying in" in r.getMessage()]
    assert len(warnings) == store.COUNTERS["retries"] and all("(attempt 1, " in w for w in warnings), warnings


@pytest.mark.parametrize("case", ["bucket", "object", "credentials"])
def test_a_missing_bucket_object_or_credentials_is_one_line_naming_the_url(case, s3_server, monkeypatch, capsys,
                                                                           tmp_path):
    from albert_dist.cli import main as cli_main

    s3_server.bucket("raw")
    s3_server.upload(SAMPLE / "wikitext-2-train-00.txt", "s3://raw/a.txt")
    url = {"bucket": "s3://no-such-bucket/x/*.txt", "object": "s3://raw/b.txt", "credentials": "s3://raw/a.txt"}[case]
    if case == "credentials":  # and no fall back to an unsigned request
        monkeypatch.delenv("AWS_ACCESS_KEY_ID")
        monkeypatch.delenv("AWS_SECRET_ACCESS_KEY")
        from fixtures.s3_server import _clear_fsspec

        _clear_fsspec()
    code = cli_main(["data", "prepare", "--input", url, "--output", str(tmp_path / "out"), "--tokenizer", "none"])
    err = capsys.readouterr().err.strip()
    assert code == 2 and len(err.splitlines()) == 1 and url in err, err
    expected = {"bucket": "bucket 'no-such-bucket' does not exist", "object": "does not exist",
                "credentials": "no credentials"}[case]
    assert expected in err
    # the preflight of `albert-dist train` (before any process group): the same refusal, naming the key
    from albert_dist.apps.pretrain import preflight
    from albert_dist.config import load_config

    with pytest.raises(ValueError, match=r"data\.train\[0\]\.paths: .*" + re.escape(expected)):
        preflight.check_inputs(load_config(None, [f"data.train=[{url}]", "data.validation=[]"]))


def _same_batches(a: list[dict], b: list[dict]) -> None:
    import torch

    assert len(a) == len(b)
    for x, y in zip(a, b):
        for k in x:
            assert torch.equal(x[k], y[k]), k


@pytest.mark.parametrize("workers", [0, 2])
def test_exact_resume_from_the_bucket(workers, local_corpus, s3_server):
    """The training loader over s3:// gives the local files' batches, and a resume from its state continues
    them exactly (2 loader workers: forked processes reading the bucket), as the local resume tests check."""
    from albert_dist.data.config import DataConfig
    from albert_dist.data.loader import build_train_loader

    s3_server.bucket("raw")
    s3_server.upload(local_corpus["txt"], "s3://raw/txt")
    s3_server.upload(local_corpus["parquet"], "s3://raw/parquet")

    def cfg(root: str) -> DataConfig:
        return DataConfig(train=[SourceConfig(paths=[f"{root}txt"]), SourceConfig(paths=[f"{root}parquet"])],
                          validation=[], tokenizer_path=str(SAMPLE / "spiece.model"), max_seq_length=64,
                          num_workers=workers, shard_piece_bytes=PIECE, shuffle_documents=4)

    local_root = str(local_corpus["txt"].parent) + "/"
    reference = [b for _, b in zip(range(8), build_train_loader(cfg(local_root), 4, rank=1, world_size=2))]
    first = build_train_loader(cfg("s3://raw/"), 4, rank=1, world_size=2)
    it = iter(first)
    _same_batches([next(it) for _ in range(3)], reference[:3])
    resumed = build_train_loader(cfg("s3://raw/"), 4, rank=1, world_size=2)
    resumed.load_state_dict(first.state_dict())
    _same_batches([b for _, b in zip(range(5), resumed)], reference[3:])


def test_tokenizer_train_and_data_plan_take_urls(local_corpus, s3_server, tmp_path, capsys):
    """`tokenizer train --input s3://...` trains the same vocabulary as on the local files; `data plan` on a
    recipe whose source is a URL prints the same plan as on the local folder."""
    from albert_dist.cli import main as cli_main

    s3_server.bucket("raw")
    s3_server.upload(local_corpus["jsonl.zst"], "s3://raw/j")
    vocabs = []
    for i, src in enumerate([str(local_corpus["jsonl.zst"] / "*.jsonl.zst"), "s3://raw/j/*.jsonl.zst"]):
        assert cli_main(["tokenizer", "train", "--input", src, "--vocab-size", "150", "--output", str(tmp_path / f"t{i}")]) == 0
        vocabs.append((tmp_path / f"t{i}" / "spiece.vocab").read_text())
    assert vocabs[0] == vocabs[1]
    recipe = str(REPO / "configs/pretrain/albert-tiny-wikitext.yaml")
    plans = []
    for src in [str(local_corpus["jsonl.zst"]), "s3://raw/j"]:
        capsys.readouterr()
        assert cli_main(["data", "plan", "--config", recipe, "--ranks", "2", "--json", f"data.train=[{src}]"]) == 0
        plan = json.loads(capsys.readouterr().out)["sources"][0]
        plans.append({k: v for k, v in plan.items() if k not in ("where", "paths", "plan_s", "manifest")})
    assert plans[0] == plans[1] and plans[0]["pieces"] == 2


def test_gs_urls_read_and_prepare_like_local_files(local_corpus, gcs_server, tmp_path, monkeypatch):
    """gs:// through gcsfs against a GCS emulator: the three formats read as on disk, and prepare gs -> gs
    writes the local prepare's shards (sha256) with the manifest last."""
    monkeypatch.setenv("ALBERT_DIST_PREPARE_TMP", str(tmp_path / "work"))
    gcs_server.bucket("raw")
    gcs_server.bucket("prepared")
    for kind, folder in local_corpus.items():
        gcs_server.upload(folder, f"gs://raw/{kind}")
        local = list(iter_texts([SourceConfig(paths=[str(folder)])], "t", 1 << 20))
        assert list(iter_texts([SourceConfig(paths=[f"gs://raw/{kind}"])], "t", 1 << 20)) == local
        assert _slot_documents(SourceConfig(paths=[f"gs://raw/{kind}"]), 4) == \
            _slot_documents(SourceConfig(paths=[str(folder)]), 4)

    def opts(src: str, out: str) -> options.PrepareOptions:
        return options.PrepareOptions(sources=[SourceConfig(paths=[src])], output=out, num_shards=2,
                                   tokenizer_path=None, progress=False)

    ref = run.prepare(opts(str(local_corpus["parquet"]), str(tmp_path / "local-out")), "ref")
    got = run.prepare(opts("gs://raw/parquet", "gs://prepared/p"), "gs")
    assert [e["sha256"] for e in got["files"]] == [e["sha256"] for e in ref["files"]]
    assert publish.load_manifest("gs://prepared/p")["documents"] == ref["documents"]
    assert list(iter_texts([SourceConfig(paths=["gs://prepared/p"])], "t", 1 << 20)) == \
        list(iter_texts([SourceConfig(paths=[str(tmp_path / "local-out")])], "t", 1 << 20))


def test_gs_without_credentials_is_an_error_not_an_anonymous_request(gcs_server, monkeypatch, tmp_path):
    """gcsfs would fall back to unsigned requests when google-auth finds no credentials; asked for nothing, we
    refuse naming the URL instead."""
    import fsspec.config
    from fixtures.s3_server import _clear_fsspec

    gcs_server.bucket("raw")
    gcs_server.upload(SAMPLE / "wikitext-2-train-00.txt", "gs://raw/a.txt")
    monkeypatch.delitem(fsspec.config.conf, "gcs")
    for var in ("GOOGLE_APPLICATION_CREDENTIALS", "CLOUDSDK_CONFIG", "GCE_METADATA_HOST", "GCE_METADATA_IP"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("CLOUDSDK_CONFIG", str(tmp_path / "no-gcloud"))  # no gcloud login of this machine
    monkeypatch.setenv("GCE_METADATA_HOST", "127.0.0.1:9")  # no instance metadata server either (discard port)
    monkeypatch.setenv("GCE_METADATA_IP", "127.0.0.1:9")
    _clear_fsspec()
    with pytest.raises(ValueError, match=r"gs://raw/a.txt: no credentials found .* FSSPEC_GCS_TOKEN=anon"):
        list(iter_texts([SourceConfig(paths=["gs://raw/a.txt"])], "t", 1 << 20))
