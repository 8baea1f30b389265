"""How a corpus is found, fetched and read: discover, pieces (the one planning entry point), read, store, cache, hub."""
