"""`albert-dist data prepare`: raw corpora -> deduplicated parquet shards sized for a cluster + manifest.json.

This file holds no code: import the module that defines a name (`from albert_dist.data.prepare.run import
prepare`), so a reader follows every name to its home. The pipeline and its guarantees: `run`'s docstring.

    options.py    PrepareOptions (what a prepare does, its fingerprint), shard_sizes (shards and row groups)
    run.py        prepare(): the lock, the work directory, the stages in order, the manifest, the rename
    scan.py       stage 1: input pieces -> spool files of usable documents and their hashes, counted skips
    jsonl.py      JSON lines a block at a time into Arrow (pyarrow's reader), exactly the training reader's records
    dedup.py      stage 2: exact duplicates from the hashes, in memory or bucketed on disk
    write.py      stage 3: spool -> shards of equal bytes, row groups of row_group_bytes
    tokens.py     the token estimate (a sample of the output, encoded as training does)
    publish.py    the manifest's reader; an object-store output uploaded shards first, manifest last
    lock.py       OutputLock: one prepare per output
    pool.py       the process pool the scan and write stages share, and their progress bar
"""
