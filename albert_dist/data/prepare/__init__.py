"""`albert-dist data prepare`: raw corpora -> deduplicated parquet shards sized for a cluster + manifest.json."""
# No code here: import the module that defines a name (`from albert_dist.data.prepare.run import prepare`).
