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


def _stack_module():  # scripts/container_stack.py, which scripts/containers runs
    spec = importlib.util.spec_from_file_location("container_stack", REPO / "scripts" / "container_stack.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_agent_checks_catch_a_leak_a_write_and_a_missing_file() -> None:
    stack = _stack_module()
    expected = stack.visible_files(["billing"])
    assert expected != stack.visible_files([])
    image = (stack.SAMPLE_SITE / "images" / "logo.png").stat().st_size
    good = "\n".join([*(f"FILE {key}" for key in sorted(expected)), f"IMAGE-BYTES {image}",
                      "WRITE-REFUSED touch: cannot touch '/docs/new.md': Read-only file system", "DONE"])  # fmt: skip
    assert stack.check_agent("alice", good, expected) == []
    hidden = sorted(stack.visible_files(["admin"]) - expected)[0]
    assert stack.check_agent("alice", f"{good}\nFILE {hidden}", expected)  # a hidden page shows
    assert stack.check_agent("alice", good.replace(f"FILE {sorted(expected)[0]}\n", ""), expected)
    assert stack.check_agent("alice", good.replace("WRITE-REFUSED", "WRITE-ALLOWED"), expected)
    assert stack.check_agent("alice", f"{good}\nREACHES-CHROMA", expected)
    assert stack.check_agent("alice", good.replace(f"IMAGE-BYTES {image}", "IMAGE-BYTES 0"), expected)


def test_container_ulimits_stay_within_what_this_machine_allows() -> None:
    import resource

    nofile, nproc = _stack_module().machine_limits()
    assert 0 < nofile <= resource.getrlimit(resource.RLIMIT_NOFILE)[1]
    assert 0 < nproc <= int(Path("/proc/sys/kernel/pid_max").read_text())
