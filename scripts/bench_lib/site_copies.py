"""Many sites from one ingest: the records of one site's collection (its tree record included)
written under other site names on the same Chroma server.

chromafs-ingest writes one site per run (~1-2 s of start-up each, plus chunking and embedding);
the density figure needs hundreds of sites, so it ingests the corpus once and copies the
collection's records (ids, documents, metadatas, embeddings) verbatim: a copy is the same site
byte for byte under another name (nothing in a record names its site; the collection does).
Given Redis, a copy's tree is published there too, as `chromafs-ingest --redis-url` does.
"""

from __future__ import annotations

import time
from typing import Any

from chromafs_fuse.backends.chroma_store import ChromaLocation, connect_client
from chromafs_fuse.backends.redis_cache import RedisCache
from chromafs_fuse.config import RedisSettings
from chromafs_fuse.names import TREE_RECORD_ID, TREE_VERSION_FIELD
from chromafs_fuse.site.publisher import publish_tree

READ_BATCH = 5000  # Chroma refuses one get of every record of a large collection


class SiteCopier:
    """Reads the site `base` from the Chroma server at `url` once; `copy(name)` writes it as `name`
    (and publishes its tree to the Redis at `redis_url`, if given)."""

    def __init__(self, url: str, base: str, redis_url: str | None = None) -> None:
        self.redis = RedisCache.from_settings(RedisSettings(redis_url)) if redis_url else None
        self.client = connect_client(ChromaLocation(url=url, collection=base), timeout_s=60)
        source = self.client.get_collection(base, embedding_function=None)
        self.metadata = dict(source.metadata or {})
        self.records: dict[str, list[Any]] = {"ids": [], "documents": [], "metadatas": [], "embeddings": []}
        for offset in range(0, source.count(), READ_BATCH):
            page = source.get(include=["documents", "metadatas", "embeddings"], limit=READ_BATCH, offset=offset)
            for field, values in self.records.items():
                values.extend(page[field])
        self.batch = int(self.client.get_max_batch_size())
        self.seconds: list[float] = []

    def copy(self, name: str) -> None:
        started = time.perf_counter()
        target = self.client.get_or_create_collection(name, embedding_function=None, metadata=self.metadata)
        count = len(self.records["ids"])
        for start in range(0, count, self.batch):
            end = start + self.batch
            target.upsert(**{field: values[start:end] for field, values in self.records.items()})
        if self.redis is not None:
            index = self.records["ids"].index(TREE_RECORD_ID)
            version = str(self.records["metadatas"][index][TREE_VERSION_FIELD])
            document = str(self.records["documents"][index]).encode()
            assert publish_tree(self.redis, name, name, document, version, self.redis.tree_ttl_s), "Redis refused"
        self.seconds.append(time.perf_counter() - started)

    def summary(self) -> dict[str, Any]:
        copies = len(self.seconds)
        return {
            "records_per_site": len(self.records["ids"]),
            "copies": copies,
            "copy_mean_s": sum(self.seconds) / copies if copies else None,
        }
