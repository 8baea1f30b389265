"""Object-store access for corpus files: fsspec URLs (``s3://``, ``gs://``, any fsspec protocol) beside local paths.

Every data command takes a URL wherever it takes a local path (sources, ``tokenizer train --input``, ``data
prepare --input/--output``, ``data plan``); the rest of the data library calls this module for what differs:

* discovery (`expand`): a glob, a prefix ("directory") or one object, each object's size and version (ETag /
  generation) taken from the listing and kept per process (`stat`), so planning 10,000 objects costs a few LIST
  calls and no HEAD per object;
* ranged reads (`RangedFile`): a byte range is fetched with one ranged GET per ``read`` (the readers size their
  reads to their pieces: `albert_dist.data.sources.read.split_records`), a compressed object is streamed in
  `SEQUENTIAL_BLOCK_BYTES` blocks, and a parquet row group is read from its column chunk's byte range alone,
  the footer parsed once per process (`parquet_metadata`). Nothing downloads a whole object a slot does not own;
* read-ahead (`ReadAhead`): a slot's reader fetches the next `READ_AHEAD_PIECES` pieces' bytes in background
  threads while it decodes the current one, so the per-request latency of a bucket (10-50 ms) overlaps the
  work instead of adding to it;
* counting (`COUNTERS`): ``bytes_requested`` (bytes the server sent), ``requests``, ``retries``; the readers add
  ``bytes_used`` (bytes of the pieces they own); bench/object_store.py prints the ratio;
* faults: every read, list and write goes through `call`, the one retry layer (`RetryPolicy`: exponential
  back-off with full jitter over a time budget, ``data.store_retry_s``; a warning names the URL and the attempt).
  The policy is a value handed to what reads (``retry=``: a training stream's is made from its own config,
  `albert_dist.data.loader.PretrainingStream`), never a setting of the process: two streams of one process keep
  their own budgets; a command without a recipe reads under `DEFAULT_RETRY`.
  A transient error (5xx/429 surfacing as OSError, a dropped connection, a timeout) is retried from the same
  offset, so the stream continues where it was; when the budget is spent `StoreUnavailable` is raised (a
  training job checkpoints and exits 75: `albert_dist.apps.pretrain.trainer`). A missing object, a denied one or missing
  credentials is not retried and raises `StoreError` naming the URL.

Credentials come from the filesystem's own chain (s3fs/botocore: the AWS_* environment, ~/.aws files, instance
roles; gcsfs: google-auth's chain alone, `_options`); they are never logged. An unsigned (anonymous) request is
made only when asked for, with fsspec's standard configuration (``FSSPEC_S3_ANON=true``, ``FSSPEC_GCS_TOKEN=anon``,
or the same in ~/.config/fsspec/conf.json): without credentials a request fails with `StoreError`, it never
falls back.
"""
from __future__ import annotations

import contextlib
import io
import logging
import os
import re
import random
import threading
import time
import weakref
from collections import Counter
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Callable, Optional

if TYPE_CHECKING:  # imported where a store is called: a local-only job (the GPU check) starts without it
    import tenacity

from albert_dist.exit_codes import TryAgainLater

logger = logging.getLogger(__name__)

_URL_RE = re.compile(r"^[A-Za-z][A-Za-z0-9+.\-]*://")
#: a compressed object (one piece, read start to end) is fetched in blocks growing from the first to the largest
#: size (doubling): a probe of its first records (the text-field check, planning) costs one small request, a
#: full read few requests
FIRST_SEQUENTIAL_BLOCK_BYTES = 256 << 10
SEQUENTIAL_BLOCK_BYTES = 8 << 20
#: bytes fetched from the end of a parquet object to find its footer (pyarrow's own first read; a larger footer,
#: e.g. the ~120 KB of a `data prepare` shard of 128 row groups, costs one more request for the rest)
FOOTER_SAMPLE_BYTES = 64 << 10

#: pieces a slot's reader has fetched (or is fetching) ahead of the one it reads (`ReadAhead`): at most this many
#: requests in flight and this many pieces' bytes held per reader (a piece is a row group's text chunk, ~64 KiB
#: in a `data prepare` shard, or a byte range of at most ``data.shard_piece_bytes``)
READ_AHEAD_PIECES = 4

#: process-wide counts (bytes_requested, requests, retries, bytes_used); a forked worker starts from the parent's
COUNTERS: Counter = Counter()
_LOCK = threading.Lock()
#: url -> {"size": int, "version": str}, filled by listings (`expand`) and `stat`
_STAT: dict[str, dict[str, Any]] = {}
#: url -> a complete local copy of that version of the object (albert_dist.data.sources.cache), read in its place by
#: `RangedFile` while `read_locally` is in force: the same readers and pieces, 0 remote bytes
_LOCAL_COPIES: dict[str, str] = {}


class StoreError(ValueError):
    """A URL that cannot be read for a reason retrying does not fix: missing bucket/object, access denied,
    missing credentials. A ValueError, so the commands report it as bad input (exit 2) naming the URL."""


class ObjectMissing(StoreError):
    """`StoreError` for an object (or bucket) that does not exist: a reader of a piece the job planned turns it
    into `albert_dist.exit_codes.InputVanished` (`albert_dist.data.sources.read.read_piece`)."""


def is_url(path: str) -> bool:
    """True for an fsspec URL with a protocol other than ``file://`` (``s3://b/k``, ``gs://b/k``, ``memory://x``)."""
    return bool(_URL_RE.match(path)) and not path.startswith("file://")


def local_path(path: str) -> str:
    """``file:///x`` -> ``/x``; anything else unchanged."""
    return path[len("file://"):] if path.startswith("file://") else path


def _options(protocol: str) -> dict[str, Any]:
    """Storage options we set: for S3, no retries inside botocore (``total_max_attempts=1``; a user's fsspec
    configuration of ``config_kwargs.retries`` still wins), and none inside s3fs (`filesystem`), so `call` is the
    one retry layer: it retries from the same offset and warns with the attempt count, where theirs retry
    silently. Everything else (credentials, endpoint, timeouts, ``anon``) is left to fsspec's configuration and the
    library's own chain."""
    import fsspec.config

    if protocol in ("gs", "gcs"):
        # gcsfs tries google-auth's chain and then falls back to anonymous requests without a word: ask for the
        # chain alone, so missing credentials are an error; anonymous only when configured (FSSPEC_GCS_TOKEN=anon)
        configured = any("token" in fsspec.config.conf.get(p, {}) for p in ("gs", "gcs"))
        return {} if configured else {"token": "google_default"}
    if protocol not in ("s3", "s3a"):
        return {}
    config_kwargs = dict(fsspec.config.conf.get(protocol, {}).get("config_kwargs") or {})
    config_kwargs.setdefault("retries", {"total_max_attempts": 1, "mode": "standard"})
    return {"config_kwargs": config_kwargs}


def filesystem(url: str):
    """(fsspec filesystem, path inside it) of ``url``; instances are cached by fsspec (per process)."""
    from fsspec.core import url_to_fs

    try:
        fs, path = url_to_fs(url, **_options(url.split("://", 1)[0].lower()))
    except ImportError as err:
        raise StoreError(f"{url}: the filesystem for this protocol is not installed ({err}); for gs:// install "
                         "albert_dist[gcs]") from None
    except Exception as err:  # noqa: BLE001 - credentials are resolved when the filesystem is made (gcsfs)
        raise StoreError(_describe(url, err)) from None
    if hasattr(fs, "retries") and type(fs).__module__.startswith("s3fs"):
        fs.retries = 1  # s3fs's own retry loop (a class attribute, 5): one attempt, `call` retries
    return fs, path


def _count(**kw: int) -> None:
    with _LOCK:
        COUNTERS.update(kw)


def _describe(url: str, err: BaseException) -> str:
    """One line for a non-transient error, without the library's object dumps."""
    name = type(err).__name__
    text = " ".join(str(err).split())
    if name in ("NoCredentialsError", "PartialCredentialsError", "CredentialRetrievalError"):
        return (f"{url}: no credentials found for the object store ({text}); set AWS_ACCESS_KEY_ID/"
                "AWS_SECRET_ACCESS_KEY (or a profile, an instance role), or FSSPEC_S3_ANON=true for a public bucket")
    if name in ("DefaultCredentialsError", "RefreshError"):
        return (f"{url}: no credentials found for the object store ({text[:200]}); set "
                "GOOGLE_APPLICATION_CREDENTIALS (or gcloud auth application-default login, a service account), "
                "or FSSPEC_GCS_TOKEN=anon for a public bucket")
    if isinstance(err, PermissionError) or "AccessDenied" in text or "Forbidden" in text:
        return f"{url}: access denied ({name})"
    if isinstance(err, FileNotFoundError) or "NoSuchBucket" in text or "NoSuchKey" in text:
        return f"{url}: does not exist ({'no such bucket' if 'NoSuchBucket' in text else 'no such object'})"
    return f"{url}: {name}: {text}"


def _fatal(err: BaseException) -> bool:
    """Errors retrying cannot fix (the others: 5xx, 429 throttling, dropped connections, timeouts)."""
    name = type(err).__name__
    if isinstance(err, (FileNotFoundError, PermissionError, IsADirectoryError, NotADirectoryError, TypeError,
                        AttributeError, NotImplementedError)):  # the last three: a bug, not the store
        return True
    if name in ("NoCredentialsError", "PartialCredentialsError", "CredentialRetrievalError", "ParamValidationError",
                "DefaultCredentialsError", "RefreshError"):
        return True
    # s3fs turns most S3 error codes into FileNotFoundError/PermissionError; these are the ones it may not (error
    # codes only: a number would match byte counts in a message)
    text = str(err)
    return any(code in text for code in ("AccessDenied", "NoSuchBucket", "NoSuchKey", "InvalidAccessKeyId",
                                         "SignatureDoesNotMatch", "InvalidBucketName"))


@dataclass(frozen=True)
class RetryPolicy:
    """How long and how often a failed request is tried again: waits drawn uniformly from [0, min(max_backoff_s,
    first_backoff_s x 2^n)] before the (n+1)-th retry ("full jitter": AWS's "Exponential Backoff and Jitter", what
    botocore's standard mode does, capped at its 20 s), the last attempt made when ``budget_s`` has passed since
    the first one. Jitter spreads the retries of the many ranks and loader workers an outage hits at once;
    the budget (minutes) outlasts a blip, as S3/GCS clients and MosaicML streaming do.

    ``clock``, ``sleep`` and ``rng`` (a ``random.Random``; None: the ``random`` module's generator, reseeded in
    each forked loader worker, so the workers' waits differ) stand in for time and randomness in tests; the
    default policy pickles (a spawned worker's copy of a stream). Raises ValueError naming the field for a budget
    <= 0, or a first back-off < 0 or above its cap."""

    budget_s: float = 300.0
    first_backoff_s: float = 0.5
    max_backoff_s: float = 20.0
    clock: Callable[[], float] = field(default=time.monotonic, compare=False, repr=False)
    sleep: Callable[[float], None] = field(default=time.sleep, compare=False, repr=False)
    rng: Any = field(default=None, compare=False, repr=False)

    def __post_init__(self) -> None:
        if not self.budget_s > 0:
            raise ValueError(f"data.store_retry_s must be > 0, got {self.budget_s!r}")
        if not 0 <= self.first_backoff_s <= self.max_backoff_s:
            raise ValueError(f"first_backoff_s must be in [0, max_backoff_s={self.max_backoff_s}], got "
                             f"{self.first_backoff_s!r}")

    def retrying(self, retry_if: Callable[[BaseException], bool], before_sleep=None) -> tenacity.Retrying:
        """A `tenacity.Retrying` that retries the errors ``retry_if`` accepts under this policy and re-raises the
        last one when the budget is spent (or at once, for any other error). The budget starts now."""
        import tenacity

        started = self.clock()
        rng = random if self.rng is None else self.rng

        def wait(state: tenacity.RetryCallState) -> float:  # the last one ends when the budget does
            cap = min(self.max_backoff_s, self.first_backoff_s * 2 ** (state.attempt_number - 1))
            return min(rng.uniform(0.0, cap), max(0.0, self.budget_s - (self.clock() - started)))

        def stop(state: tenacity.RetryCallState) -> bool:
            return self.clock() - started >= self.budget_s

        return tenacity.Retrying(retry=tenacity.retry_if_exception(retry_if), wait=wait, stop=stop,
                                 sleep=self.sleep, before_sleep=before_sleep, reraise=True)


#: The policy of a command that has no recipe, so no ``data.store_retry_s`` (``albert-dist data prepare``,
#: ``albert-dist tokenizer train --input``), and the default of every function here that takes ``retry``:
#: `albert_dist.data.config.DataConfig.store_retry_s`'s default budget, 300 s. A frozen value bound as those
#: defaults when this module is imported: nothing reads this name at call time, so rebinding it changes nothing.
#: A job passes its own: ``RetryPolicy(budget_s=cfg.data.store_retry_s)``.
DEFAULT_RETRY = RetryPolicy()


class StoreUnavailable(TryAgainLater):
    """The object store answered ``url`` with transient errors (or not at all) for the whole retry budget.

    Neither a ValueError (the input is fine: exit 2 would be wrong) nor an OSError (a reader takes an OSError for
    a damaged piece and skips the rest of it: an outage must not lose data). A training job checkpoints the step
    it reached and exits 75 (`albert_dist.exit_codes.EXIT_PREEMPTED`), so ``--resume auto`` continues (a loader
    worker hands it to the training process: `albert_dist.data.loader.next_batch`). The message is one line naming
    the URL."""


def call(url: str, what: str, fn, *args, retry: RetryPolicy = DEFAULT_RETRY, **kwargs):
    """``fn(*args, **kwargs)`` retried on transient errors under ``retry``; ``what`` names the operation in the
    warnings. Raises `StoreError` at once for a fatal error, `StoreUnavailable` when the budget is spent."""
    policy = retry
    first = policy.clock()

    def warn(state: tenacity.RetryCallState) -> None:
        err = state.outcome.exception()
        _count(retries=1)
        logger.warning("%s: %s failed (attempt %d, %.0f s of data.store_retry_s=%g: %s: %s); retrying in %.1f s",
                       url, what, state.attempt_number, policy.clock() - first, policy.budget_s,
                       type(err).__name__, " ".join(str(err).split())[:200], state.upcoming_sleep)

    try:
        return policy.retrying(lambda err: not _fatal(err), before_sleep=warn)(fn, *args, **kwargs)
    except Exception as err:  # noqa: BLE001 - sorted into fatal / transient below
        if _fatal(err):
            line = _describe(url, err)
            raise (ObjectMissing if line.endswith(("(no such object)", "(no such bucket)")) else StoreError)(line) \
                from None
        last = _describe(url, err).split(": ", 1)[1]  # without the URL, said first
        raise StoreUnavailable(f"{url}: {what} kept failing for {policy.clock() - first:.0f} s "
                               f"(data.store_retry_s={policy.budget_s:g}): {last}") from None


def _remember(fs, info: dict) -> str:
    url = fs.unstrip_protocol(info["name"])
    version = info.get("ETag") or info.get("etag") or info.get("generation") or info.get("LastModified") or ""
    _STAT[url] = {"size": int(info.get("size") or 0), "version": str(version)}
    return url


def stat(path: str, retry: RetryPolicy = DEFAULT_RETRY) -> dict[str, Any]:
    """``{"size": bytes, "version": str}`` of a local file (version = mtime_ns) or an object (its ETag or
    generation, from the listing when `expand` found it; else one HEAD under ``retry``). Raises `StoreError` /
    OSError for a missing one."""
    if not is_url(path):
        st = os.stat(local_path(path))
        return {"size": st.st_size, "version": str(st.st_mtime_ns)}
    if path not in _STAT:
        fs, inner = filesystem(path)
        _remember(fs, call(path, "stat", fs.info, inner, retry=retry))
    return _STAT[path]


def planned_stat(url: str) -> Optional[dict[str, Any]]:
    """`stat` of ``url`` as this process last listed it (no request; None when it holds none)."""
    return _STAT.get(url)


def file_size(path: str, retry: RetryPolicy = DEFAULT_RETRY) -> int:
    """Bytes of a local file or an object (`stat`)."""
    return stat(path, retry)["size"]


def expand(raw: str, retry: RetryPolicy = DEFAULT_RETRY) -> tuple[str, list[str]]:
    """What a source path names: ``("glob" | "dir" | "file" | "missing", sorted URLs of its objects)``.

    A prefix is a "directory" (every object under it, recursively). Each request is retried under ``retry``.
    Raises `StoreError` naming the URL for a missing bucket, denied access or missing credentials (a missing
    object is "missing", the caller words it), `StoreUnavailable` when the budget is spent.
    """
    fs, inner = filesystem(raw)
    if any(ch in inner for ch in "*?["):
        found = call(raw, "list", fs.glob, inner, detail=True, retry=retry)
        if not found and "/" in inner.strip("/"):  # a glob in a missing bucket matches nothing: say which
            _check_root(fs, raw, inner, retry)
        return "glob", sorted(_remember(fs, info) for info in found.values() if info.get("type") != "directory")
    try:
        info = call(raw, "stat", fs.info, inner, retry=retry)
    except StoreError as err:
        if "does not exist (no such object)" in str(err):
            _check_root(fs, raw, inner, retry)
            return "missing", []
        raise
    if info.get("type") == "directory":
        found = call(raw, "list", fs.find, inner, detail=True, retry=retry)
        return "dir", sorted(_remember(fs, i) for i in found.values() if i.get("type") != "directory")
    return "file", [_remember(fs, info)]


def _check_root(fs, raw: str, inner: str, retry: RetryPolicy) -> None:
    """Raise `StoreError` when the bucket (first path component) of ``raw`` does not exist or is denied."""
    bucket = inner.strip("/").split("/", 1)[0]
    try:
        call(raw, "list", fs.ls, bucket, detail=False, retry=retry)
    except StoreError as err:
        if "does not exist" in str(err):
            raise StoreError(f"{raw}: bucket {bucket!r} does not exist") from None
        raise


@contextlib.contextmanager
def read_locally(copies: dict[str, str]):
    """Within the block, reads of the objects ``copies`` names (``{url: local file}``, complete copies of the
    version `stat` gives: `albert_dist.data.sources.cache.ObjectCache.pin`) come from those files and request nothing."""
    _LOCAL_COPIES.update(copies)
    try:
        yield
    finally:
        for url in copies:
            _LOCAL_COPIES.pop(url, None)


class RangedFile(io.RawIOBase):
    """A read-only, seekable file over an object: each ``read(n)`` is one ranged GET of ``n`` bytes (or, with
    ``block_bytes``, served from a read-ahead block of that size), retried from the same offset under ``retry``
    (`call`; its size too, when no listing gave it: `stat`).

    ``parts``: byte ranges already fetched, ``{(start, end): bytes}`` (a parquet footer and column chunks),
    served without a request. Counts ``bytes_requested`` and ``requests`` in `COUNTERS`.
    """

    def __init__(self, url: str, offset: int = 0, block_bytes: int = 0,
                 parts: Optional[dict[tuple[int, int], bytes]] = None, retry: RetryPolicy = DEFAULT_RETRY) -> None:
        super().__init__()
        self.url, self.retry = url, retry
        self.size = file_size(url, retry)
        self._fs, self._inner = filesystem(url)
        self._pos = offset
        self._block_bytes = block_bytes
        self._block_at, self._block = 0, b""
        self._parts = dict(parts or {})

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def tell(self) -> int:
        return self._pos

    def seek(self, offset: int, whence: int = 0) -> int:
        base = {0: 0, 1: self._pos, 2: self.size}[whence]
        self._pos = max(0, base + offset)
        return self._pos

    def fetch(self, start: int, end: int) -> bytes:
        """Bytes [start, end) of the object: one ranged GET, retried; counted (a local copy: read, not counted)."""
        end = min(end, self.size)
        if end <= start:
            return b""
        ahead = _AHEAD.pop((self.url, start, end, self.retry), None)
        if ahead is not None:  # fetched by `ReadAhead` under this file's retry policy: its bytes or its error
            return ahead.result()
        return self._get(start, end)

    def _get(self, start: int, end: int) -> bytes:
        local = _LOCAL_COPIES.get(self.url)
        if local is not None:
            fd = os.open(local, os.O_RDONLY)
            try:
                return os.pread(fd, end - start, start)
            finally:
                os.close(fd)
        data = call(self.url, f"read of bytes {start}-{end}", self._fs.cat_file, self._inner, start=start, end=end,
                    retry=self.retry)
        _count(bytes_requested=len(data), requests=1)
        return data

    def _from_parts(self, start: int, n: int) -> Optional[bytes]:
        for (a, b), data in self._parts.items():
            if a <= start and start + n <= b:
                return data[start - a:start - a + n]
        return None

    def read(self, n: int = -1) -> bytes:
        if n is None or n < 0:
            n = self.size - self._pos
        n = min(n, max(0, self.size - self._pos))
        if n == 0:
            return b""
        data = self._from_parts(self._pos, n)
        if data is None and self._block_bytes:
            if not (self._block_at <= self._pos and self._pos + n <= self._block_at + len(self._block)):
                self._block_at = self._pos
                self._block = self.fetch(self._pos, self._pos + max(n, self._block_bytes))
                self._block_bytes = min(SEQUENTIAL_BLOCK_BYTES, 2 * self._block_bytes)
            data = self._block[self._pos - self._block_at:self._pos - self._block_at + n]
        elif data is None:
            data = self.fetch(self._pos, self._pos + n)
        self._pos += len(data)
        return data

    def readinto(self, b) -> int:
        data = self.read(len(b))
        b[:len(data)] = data
        return len(data)

    def readall(self) -> bytes:
        return self.read(-1)


def open_input(path: str, offset: int = 0, sequential: bool = False, retry: RetryPolicy = DEFAULT_RETRY):
    """A binary file positioned at ``offset``: a local file (unbuffered) or a `RangedFile` reading under
    ``retry`` (``sequential``: read ahead in blocks from `FIRST_SEQUENTIAL_BLOCK_BYTES` doubling to
    `SEQUENTIAL_BLOCK_BYTES`, for a compressed object read start to end)."""
    if not is_url(path):
        f = open(local_path(path), "rb", buffering=0)
        f.seek(offset)
        return f
    return RangedFile(path, offset, FIRST_SEQUENTIAL_BLOCK_BYTES if sequential else 0, retry=retry)


def parquet_metadata(url: str, size: int, retry: RetryPolicy = DEFAULT_RETRY):
    """pyarrow FileMetaData of a parquet object from its footer alone (one ranged GET of the last
    `FOOTER_SAMPLE_BYTES`, a second one when the footer is larger; retried under ``retry``). Raises what
    pyarrow raises for a damaged footer, `StoreError` for an unreadable object."""
    import pyarrow.parquet as pq

    f = RangedFile(url, retry=retry)
    tail_at = max(0, size - FOOTER_SAMPLE_BYTES)
    tail = f.fetch(tail_at, size)
    if len(tail) >= 8 and tail[-4:] == b"PAR1":
        footer = int.from_bytes(tail[-8:-4], "little") + 8
        if footer > len(tail) and footer <= size:
            tail_at = size - footer
            tail = f.fetch(tail_at, size - len(tail)) + tail
    f._parts[(tail_at, size)] = tail
    return pq.read_metadata(f)


def column_chunk_ranges(metadata, row_group: int, columns: list[str]) -> list[tuple[int, int]]:
    """Byte ranges [start, end) of ``columns``' chunks in ``row_group`` of a parquet file (all columns when
    ``columns`` is empty), from its footer's ``metadata``."""
    group = metadata.row_group(row_group)
    ranges = []
    for j in range(group.num_columns):
        col = group.column(j)
        if columns and col.path_in_schema not in columns and col.path_in_schema.split(".")[0] not in columns:
            continue
        offsets = [col.data_page_offset, col.dictionary_page_offset if col.has_dictionary_page else None]
        start = min(o for o in offsets if o is not None)
        ranges.append((start, start + col.total_compressed_size))
    return ranges


def parquet_row_group_file(url: str, metadata, row_group: int, columns: list[str],
                           retry: RetryPolicy = DEFAULT_RETRY) -> RangedFile:
    """A `RangedFile` over a parquet object holding the byte ranges of ``columns``' chunks in ``row_group``,
    each fetched with one ranged GET (what `fsspec.parquet.open_parquet_file` does, without re-reading the
    footer per row group: the metadata comes from the per-process cache). Open it with
    ``pq.ParquetFile(f, metadata=metadata)``; any other byte pyarrow asks for is fetched (and counted) on demand,
    every fetch retried under ``retry``."""
    f = RangedFile(url, retry=retry)
    for start, end in column_chunk_ranges(metadata, row_group, columns):
        f._parts[(start, end)] = f.fetch(start, end)
    return f


#: (url, start, end, retry policy) -> the Future of a `ReadAhead` fetch of those bytes under that policy, taken
#: (once) by the `RangedFile.fetch` of a reader with the same policy (another stream's budget is not its own)
_AHEAD: dict[tuple[str, int, int, RetryPolicy], Future] = {}
os.register_at_fork(after_in_child=_AHEAD.clear)  # a forked loader worker has none of its parent's threads


def _in_background(fn: Callable[..., bytes], *args: Any) -> Future:
    """``fn(*args)`` in a daemon thread (a process that exits during an outage does not wait for a fetch that
    is retrying, as it would for a ThreadPoolExecutor's); its result or error in the returned Future."""
    future: Future = Future()

    def run() -> None:
        if future.set_running_or_notify_cancel():
            try:
                future.set_result(fn(*args))
            except BaseException as err:  # noqa: BLE001 - handed to the reader, raised where it asks for the bytes
                future.set_exception(err)

    threading.Thread(target=run, name="read-ahead", daemon=True).start()
    return future


def _drop(started: dict[int, list[tuple[str, int, int, RetryPolicy]]], before: Optional[int] = None) -> None:
    """Drop the fetches of the items of ``started`` before ``before`` (all: None) from `_AHEAD`."""
    for i in [i for i in started if before is None or i < before]:
        for key in started.pop(i):
            future = _AHEAD.pop(key, None)
            if future is not None:
                future.cancel()


class ReadAhead:
    """Fetches the bytes of the pieces a reader will read next while it reads the current one.

    ``order``: what one reader (a loader slot) reads, in its reading order; ``ranges_of(item)``: the byte ranges
    ``[(url, start, end)]`` its reader will fetch with `RangedFile.fetch` (ranges of local files or of objects with
    a local copy are ignored). `at(i)`, called when the reader starts item ``i``, starts fetching items i..i+depth
    not yet started, each range in a background thread through `call` under ``retry`` (the reader's: the bytes
    go to a `RangedFile` of the same policy), and its `StoreUnavailable` / `StoreError` is raised by the reader's
    own fetch; the fetched bytes of items before ``i`` that the reader did not ask for are dropped. Memory: at
    most ``depth + 1`` items' bytes (``depth`` default: `READ_AHEAD_PIECES`; 0: each item fetched when the reader
    starts it, as without read-ahead). Nothing here is loader state: a reader resumed at item i (after a
    checkpoint) calls ``at(i)`` and fetches again what the interrupted one had fetched ahead.
    """

    def __init__(self, order: list, ranges_of: Callable[[Any], list[tuple[str, int, int]]],
                 depth: Optional[int] = None, retry: RetryPolicy = DEFAULT_RETRY) -> None:
        self.order, self.ranges_of, self.retry = order, ranges_of, retry
        self.depth = READ_AHEAD_PIECES if depth is None else depth
        self._started: dict[int, list[tuple[str, int, int, RetryPolicy]]] = {}
        weakref.finalize(self, _drop, self._started)  # a reader dropped mid-way (a new loader) leaves nothing held

    def __reduce__(self):  # pickled (datasets hashes its generator's arguments) without fetches in flight
        return ReadAhead, (self.order, self.ranges_of, self.depth, self.retry)

    def at(self, index: int) -> None:
        """The reader starts item ``index``; raises what ``ranges_of`` raises."""
        _drop(self._started, index)
        for i in range(index, min(index + self.depth + 1, len(self.order))):
            if i in self._started:
                continue
            keys = []
            for url, start, end in self.ranges_of(self.order[i]):
                if not is_url(url) or url in _LOCAL_COPIES:
                    continue
                f = RangedFile(url, retry=self.retry)
                key = (url, start, min(end, f.size), self.retry)
                if key not in _AHEAD:
                    _AHEAD[key] = _in_background(f._get, start, key[2])
                    keys.append(key)
            self._started[i] = keys


def join(folder: str, name: str) -> str:
    """``folder/name`` for a local path or a URL (no os.path normalisation, which would fold ``s3://``)."""
    return folder.rstrip("/") + "/" + name if is_url(folder) else os.path.join(folder, name)


def common_folder(paths: list[str]) -> str:
    """The deepest folder holding every one of ``paths`` (local paths or URLs of one protocol)."""
    if not is_url(paths[0]):
        return os.path.commonpath([os.path.dirname(p) for p in paths])
    proto = paths[0].split("://", 1)[0]
    return proto + "://" + os.path.commonpath([os.path.dirname(p.split("://", 1)[1]) for p in paths])


def read_text(path: str, retry: RetryPolicy = DEFAULT_RETRY) -> Optional[str]:
    """The text of a local file or an object (read under ``retry``), or None when it does not exist. Raises
    `StoreError` (denied, no credentials), `StoreUnavailable`, and OSError as the filesystem does."""
    if not is_url(path):
        try:
            with open(local_path(path), encoding="utf-8") as f:
                return f.read()
        except FileNotFoundError:
            return None
    fs, inner = filesystem(path)
    try:
        data = call(path, "read", fs.cat_file, inner, retry=retry)
    except StoreError as err:
        if "does not exist" in str(err):
            return None
        raise
    _count(bytes_requested=len(data), requests=1)
    return data.decode("utf-8")
