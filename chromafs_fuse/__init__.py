"""chromafs: a docs site stored in Chroma, served as a read-only FUSE filesystem."""

__version__ = "0.1.0"
