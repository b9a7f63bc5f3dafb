"""Names fixed by the storage format (see docs/FORMAT.md). No imports: the
mount client loads this on its fast path."""

TREE_RECORD_ID = "__path_tree__"
RECORD_KIND_FIELD = "chromafs_record"  # metadata flag on the tree record
TREE_RECORD_KIND = "path_tree"
RETIRED_RECORD_ID = "__chromafs_retired__"  # page versions kept for mounts on an older tree
RETIRED_RECORD_KIND = "retired_versions"
LEXICON_RECORD_ID = "__chromafs_lexicon__"  # every page's term counts, for search's BM25 (lexical.py)
LEXICON_RECORD_KIND = "lexicon"
# on the lexicon record: the lexicon itself, kept out of the document (which Chroma indexes for
# full-text search, costly to rewrite: packed.py); a record written before it has it as document
LEXICON_DATA_FIELD = "chromafs_lexicon"
TREE_VERSION_FIELD = "chromafs_tree_version"  # on the tree record: what a mount polls for a new tree
# on the tree record: what its pages' access was decided from, beside their bytes (a re-ingest
# under the same inputs keeps an unchanged page's access without reading its frontmatter again)
ACCESS_INPUTS_FIELD = "chromafs_access_inputs"
# on the tree record: when the ingest that wrote it began walking the folder (seconds since the
# epoch); a later one reads again only files whose size or mtime differ, or are this recent
SCANNED_AT_FIELD = "chromafs_scanned_at"
FORMAT_FIELD = "chromafs_format"
FORMAT_VERSION = 1
PAGE_FIELD = "page_slug"
CHUNK_INDEX_FIELD = "chunk_index"
PAGE_SHA_FIELD = "page_sha256"  # which page version a chunk belongs to
EMBEDDER_FIELD = "chromafs_embedder"  # on the collection: how chunks were embedded (a query must match)
BLOB_PIECE_KIND = "blob_piece"  # a piece of a binary file kept in Chroma itself (no blob store)
BLOB_SHA_FIELD = "chromafs_blob"  # on a blob piece: the sha256 of the whole file
BLOB_PIECE_FIELD = "chromafs_piece"  # on a blob piece: its index, from 0
BLOB_DATA_FIELD = "chromafs_data"  # on a blob piece: its bytes, base64
BLOB_PIECE_PREFIX = "__chromafs_blob__:"  # blob piece ids have no '#': never a chunk's id


def chunk_id(page_key: str, page_sha256: str, index: int) -> str:
    """The record id chromafs-ingest gives chunk `index` of one version of a page."""
    return f"{page_key}#{page_sha256[:16]}#{index}"


def blob_piece_id(blob_sha256: str, index: int) -> str:
    """The record id of piece `index` of the binary file whose bytes hash to `blob_sha256`."""
    return f"{BLOB_PIECE_PREFIX}{blob_sha256}:{index}"


MAX_TOKEN_BYTES = 16 * 1024  # a JWT larger than this is refused unread
