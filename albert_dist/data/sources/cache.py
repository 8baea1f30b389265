"""A local, byte-bounded cache of whole objects, for the object-store data a node reads again and again.

**Where it pays.** The fixed validation set (`albert_dist.data.validation`) is built from its sources by every
rank, at the start of every job and of every resume; with an ``s3://``/``gs://`` source each of those builds
reads the same bytes from the store (8 ranks on a node: 8 reads per node per (re)start). With this cache the
first rank of a node downloads each object once and every later build on the node reads local disk, 0 remote
bytes (docs/data-object-store.md, "A local cache for validation sources": the measurement). Training shards are not cached:
each slot reads its pieces once per epoch (read amplification 1.00, bench/object_store.py), so a copy on disk
would only be written, never read again before the next epoch, and a corpus is larger than a node's disk.

**Why not fsspec's ``filecache::``/``simplecache::``** (fsspec 2026.7): neither bounds the bytes it holds (only
an age, ``expiry_time``), neither locks across processes (two ranks of a node both download, and write the same
file at once), and both download straight to the entry's final name, so a download killed mid-way leaves a
truncated file that ``simplecache`` (existence check only, key = the URL alone: a changed object is served stale)
serves as complete.

**The cache**, a folder (``data.cache_dir``, default ``$XDG_CACHE_HOME/albert_dist/objects`` or
``~/.cache/albert_dist/objects``), bounded by ``data.cache_max_bytes`` (0 turns it off):

* an entry is one object, keyed by its URL, version (ETag / generation, from the listing: `store.stat`) and size,
  so a changed object is a new key and never served stale; its file ``<key>-<object name>`` is complete or absent:
  a download writes ``<key>.part`` and renames it (``os.replace``) when every byte has arrived;
* ``<key>.lock`` is the entry's lock (``flock``, `albert_dist.job.lock`; `filelock` has no shared locks): a download holds it
  exclusively, so a second process on the node waits and then reads the first one's file; a reader holds it
  shared while it reads, so no other process evicts an entry in use;
* ``.cache.lock`` serialises the space accounting: a download reserves its bytes (the ``.part`` file is created
  at its full size) before it starts, so two processes never overshoot the bound together.

**The cleaning rule** (run on every miss, before the download, under ``.cache.lock``): a ``.part`` file whose entry
lock nobody holds is the leftover of a killed download (the kernel releases a dead process's flock) and is
deleted; then entries are evicted least recently used first (a hit refreshes the file's mtime), skipping those in
use, until the new object fits. An object larger than the bound, or one that cannot get room because every entry is
in use, is not cached: it is read from the store by ranges as without a cache. Deleting the folder is always safe
when no job runs.
"""
from __future__ import annotations

import contextlib
import errno
import hashlib
import logging
import os
import time
from typing import Iterator, Optional

from albert_dist.data.sources import store
from albert_dist.job.lock import flock

logger = logging.getLogger(__name__)

#: bytes per ranged GET of a download (each one retried from its offset by `store.call`)
DOWNLOAD_BLOCK_BYTES = 8 << 20
_PART, _LOCK = ".part", ".lock"
_CACHE_LOCK = ".cache.lock"


def default_dir() -> str:
    """``$XDG_CACHE_HOME/albert_dist/objects``, or ``~/.cache/albert_dist/objects`` (the XDG base-directory rule,
    as HF's ``~/.cache/huggingface``): per user, on the node's own disk."""
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(base, "albert_dist", "objects")


def _flock(path: str, exclusive: bool, blocking: bool = True) -> Optional[int]:
    """An fd of ``path`` (created if missing) holding a flock, or None when ``blocking`` is False and another
    process holds a conflicting one. Retries when the file was unlinked (an entry evicted) between the open and
    the lock, so a lock on a deleted file is never taken for the entry's."""
    while True:
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
        if not flock(fd, exclusive, blocking):
            os.close(fd)
            return None
        try:
            if os.stat(path).st_ino == os.fstat(fd).st_ino:
                return fd
        except FileNotFoundError:
            pass
        os.close(fd)


class ObjectCache:
    """Whole objects of an object store in ``root``, at most ``max_bytes`` bytes (see the module docstring).

    `pin` gives local copies to read, each held (shared lock) until the ``with`` block ends; a download is
    ranged GETs of ``block_bytes``, each retried under ``retry`` (the job's ``data.store_retry_s``). Raises
    ValueError naming ``data.cache_dir`` when ``root`` cannot be created or written, and for ``max_bytes`` < 1.
    """

    def __init__(self, root: str, max_bytes: int, block_bytes: int = DOWNLOAD_BLOCK_BYTES,
                 retry: store.RetryPolicy = store.DEFAULT_RETRY) -> None:
        if max_bytes < 1:
            raise ValueError(f"data.cache_max_bytes must be >= 1 to cache (0 turns the cache off), got {max_bytes}")
        self.root, self.max_bytes = os.path.abspath(os.path.expanduser(root)), max_bytes
        self.block_bytes, self.retry = block_bytes, retry
        try:
            os.makedirs(self.root, exist_ok=True)
            if not os.access(self.root, os.W_OK | os.X_OK):
                raise PermissionError(errno.EACCES, "no write permission")
        except OSError as err:
            raise ValueError(f"data.cache_dir={root!r}: cannot create or write there ({err.strerror or err}); "
                             "set data.cache_dir to a writable folder or data.cache_max_bytes=0 to turn the "
                             "cache off") from None

    # -- names ---------------------------------------------------------------------------------------------------
    @staticmethod
    def key(url: str, version: str, size: int) -> str:
        """The entry key of one version of an object: sha256 of URL, version and size (hex, 32 characters)."""
        return hashlib.sha256(f"{url}\0{version}\0{size}".encode()).hexdigest()[:32]

    def _paths(self, url: str) -> tuple[str, str, str, int]:
        st = store.stat(url, self.retry)
        key = self.key(url, st["version"], st["size"])
        name = url.rstrip("/").rsplit("/", 1)[-1][-100:]  # the object's name, for a person looking in the folder
        base = os.path.join(self.root, key)
        return base + "-" + name, base + _PART, base + _LOCK, st["size"]

    # -- reading -------------------------------------------------------------------------------------------------
    @contextlib.contextmanager
    def pin(self, urls: list[str]) -> Iterator[dict[str, str]]:
        """``{url: local file}`` for the objects of ``urls`` that are cached or could be downloaded into the bound
        (the others are left out: read them from the store). Each file stays on disk (a shared lock: no process
        evicts it) until the block ends. Raises `store.StoreError` as the download's reads do."""
        held: dict[str, str] = {}
        fds: list[int] = []
        try:
            for url in urls:
                got = self._acquire(url)
                if got is not None:
                    fds.append(got[0])
                    held[url] = got[1]
            yield held
        finally:
            for fd in fds:
                os.close(fd)

    def _acquire(self, url: str) -> Optional[tuple[int, str]]:
        """(fd holding the entry's shared lock, local file) of ``url``, downloading it on a miss; None when it is not
        cached (larger than the bound, or no room)."""
        data, part, lock, size = self._paths(url)
        if size > self.max_bytes:
            logger.info("cache: %s (%d bytes) is larger than data.cache_max_bytes=%d; read from the store", url, size,
                        self.max_bytes)
            return None
        while True:
            fd = _flock(lock, exclusive=False)
            if _complete(data, size):
                os.utime(data)  # the least-recently-used order is the files' mtimes
                store._count(cache_hits=1)
                return fd, data
            os.close(fd)
            fd = _flock(lock, exclusive=True)  # a download in another process: wait for it
            try:
                if not _complete(data, size):
                    if not self._reserve(part, size):
                        logger.warning("cache: no room for %s (%d bytes) in %s (data.cache_max_bytes=%d, the rest in "
                                       "use); read from the store", url, size, self.root, self.max_bytes)
                        os.close(fd)
                        return None
                    self._download(url, part, size)
                    os.replace(part, data)  # the entry appears whole or not at all
                    store._count(cache_misses=1)
                # shared from here; flock's conversion is not atomic (it unlocks first), so an evictor may slip in:
                # check the entry is still there, else start over
                flock(fd, exclusive=False)
            except BaseException:
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(part)
                os.close(fd)
                raise
            if _complete(data, size) and _same_file(lock, fd):
                return fd, data
            os.close(fd)

    def _download(self, url: str, part: str, size: int) -> None:
        """Every byte of ``url`` into ``part`` (already ``size`` bytes long): ranged GETs of ``block_bytes``,
        each retried and counted (``bytes_requested``) by `store.RangedFile`."""
        t0 = time.monotonic()
        remote = store.RangedFile(url, retry=self.retry)
        with open(part, "r+b") as f:
            for start in range(0, size, self.block_bytes):
                data = remote.fetch(start, start + self.block_bytes)
                if len(data) != min(self.block_bytes, size - start):
                    raise store.StoreError(f"{url}: the object changed while it was downloaded (got {len(data)} "
                                           f"bytes at offset {start} of {size})")
                f.write(data)
            # on disk before the rename makes it an entry: after a node crash (not only a killed process) an entry
            # never holds the zeros of a preallocated file that never got its bytes
            f.flush()
            os.fsync(f.fileno())
        logger.info("cache: downloaded %s (%d bytes) in %.2f s", url, size, time.monotonic() - t0)

    # -- space ---------------------------------------------------------------------------------------------------
    def _reserve(self, part: str, size: int) -> bool:
        """Make room for ``size`` bytes (the cleaning rule of the module docstring) and create ``part`` at that size,
        under the cache-wide lock; False when the entries in use leave no room."""
        fd = _flock(os.path.join(self.root, _CACHE_LOCK), exclusive=True)
        try:
            self.clean()
            entries = self.entries()
            used = sum(e[2] for e in entries)
            for mtime, path, nbytes in sorted(entries):
                if used + size <= self.max_bytes:
                    break
                if path.endswith(_PART) or not self._evict(path):
                    continue
                logger.info("cache: evicted %s (least recently used)", path)
                used -= nbytes
            if used + size > self.max_bytes:
                return False
            with open(part, "wb") as f:
                f.truncate(size)  # sparse: counts its whole size in `entries` at once
            return True
        finally:
            os.close(fd)

    def entries(self) -> list[tuple[float, str, int]]:
        """(mtime, path, bytes) of every entry file and download in progress in the cache folder."""
        out = []
        with os.scandir(self.root) as it:
            for e in it:
                if e.name.startswith(".") or e.name.endswith(_LOCK):
                    continue
                with contextlib.suppress(FileNotFoundError):
                    st = e.stat()
                    out.append((st.st_mtime, e.path, st.st_size))
        return out

    def _evict(self, path: str) -> bool:
        """Delete the entry of ``path`` (file, lock) unless a process holds its lock; True when deleted."""
        lock = os.path.join(self.root, os.path.basename(path)[:32] + _LOCK)
        fd = _flock(lock, exclusive=True, blocking=False)
        if fd is None:
            return False
        try:
            for p in (path, lock):
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(p)
            return True
        finally:
            os.close(fd)

    def clean(self) -> int:
        """Delete every ``.part`` file whose download is dead (its entry lock free), and the lock files of entries
        that hold no file (an object that was not cached) and no process holds; returns how many ``.part`` files."""
        removed = 0
        keys = set()
        for _, path, _ in self.entries():
            keys.add(os.path.basename(path)[:32])
            if path.endswith(_PART) and self._evict(path):
                logger.info("cache: removed %s, left by a download that did not finish", path)
                removed += 1
        with os.scandir(self.root) as it:
            orphans = [e.path for e in it if e.name.endswith(_LOCK) and e.name[:32] not in keys
                       and not e.name.startswith(".")]
        for lock in orphans:
            self._evict(lock)  # unlinks the lock file alone, unless a process holds it
        return removed


def _complete(path: str, size: int) -> bool:
    try:
        return os.path.getsize(path) == size
    except FileNotFoundError:
        return False


def _same_file(path: str, fd: int) -> bool:
    try:
        return os.stat(path).st_ino == os.fstat(fd).st_ino
    except FileNotFoundError:
        return False


