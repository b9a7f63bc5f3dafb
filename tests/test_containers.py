"""The container files (docker/, .dockerignore, the integration workflow) hold together.
No Docker engine runs here: this is the static part of what CI in Docker would catch."""

from __future__ import annotations

import importlib.util
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent


def test_container_files_pass_the_static_checks() -> None:
    spec = importlib.util.spec_from_file_location("check_containers", REPO / "scripts" / "check_containers.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    assert module.check_all(REPO, tools=False) == []
