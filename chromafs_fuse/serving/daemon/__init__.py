"""The standalone daemon: one mount for one reader (chromafs-mount alone, --isolated, --search-dir)."""
