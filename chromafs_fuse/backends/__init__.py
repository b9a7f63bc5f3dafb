"""Where sites live: Chroma (embedded, REST, its SQLite file read directly), the Redis cache, the blob store."""
