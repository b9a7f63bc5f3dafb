"""Helpers of `scripts/bench`, the side-by-side benchmark of chromafs against tmpfs and a sandbox copy.

The servers, mounts and waits the tests use too are in scripts/harness (beside this package).
"""
