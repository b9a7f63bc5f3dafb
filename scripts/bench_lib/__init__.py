"""Helpers of `scripts/bench`, the side-by-side benchmark of chromafs against tmpfs and a sandbox copy."""
