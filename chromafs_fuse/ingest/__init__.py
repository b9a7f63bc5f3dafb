"""Turning a docs folder into a Chroma collection: scan, frontmatter, access rules, chunks, embeddings."""
