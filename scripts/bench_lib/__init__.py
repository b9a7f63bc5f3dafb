"""Helpers of `scripts/bench`, the side-by-side benchmark of chromafs against tmpfs and a sandbox copy."""

import sys
from pathlib import Path

# The servers, mounts and waits the tests use too live in tests/infra.py: importable as `infra`.
_TESTS = str(Path(__file__).resolve().parents[2] / "tests")
if _TESTS not in sys.path:
    sys.path.append(_TESTS)
