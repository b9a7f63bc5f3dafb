"""scripts/containers: chromafs's container stack, run for real with podman or docker.

1. An engine: docker if its daemon answers, else rootful podman (installed from apt if
   missing, configured for a host without systemd: cgroupfs, runc, a file event log, ulimits
   no higher than this machine allows). `--engine docker` where no daemon answers: Debian's
   docker.io from apt, and dockerd started under systemd, or else as a child of this script
   that it stops at the end, putting iptables, ip_forward and the bridge back as they were.
2. A base: the Dockerfiles' public defaults when a registry answers; else a Debian bookworm
   base made here with mmdebstrap and imported (cached in /var/tmp/chromafs-containers).
3. Every image: chromafs, the agent, Chroma (`chroma run`), Redis, S3 (moto) [, the tests].
4. The stack of docker/compose.yaml, service by service, health polled by this script: the
   services share one network namespace and talk on 127.0.0.1 (no DNS plugin is needed).
   The bundled sample site is ingested; `chromafs-mountd` (root, /dev/fuse, SYS_ADMIN) serves
   a session for each of two tokens on a host directory shared into the agents.
5. A bash agent container per session (non-root, no network, read-only root, the docs
   read-only): a scripted agent session whose file list must be exactly its token's pages,
   and whose write must fail.
6. Teardown, then a check that no container, volume, network, mount or process is left.
7. docker/compose.yaml as a user runs it: `docker compose` (v2), else Debian's docker-compose
   1.29 (v1, from apt), or podman-compose (PyPI) with podman.
With --tests, the integration tests then run inside a container with /dev/fuse.
Every build gets this machine's CA bundle as a file of its context (docker/build-ca/), so pip
passes a TLS-inspecting proxy with docker or podman, BuildKit on or off. A run killed halfway
leaves containers that the next run removes first (and a dockerd of its own that it adopts).

Here: the command line, the run in that order, its teardown, and --tests. Each part is in
scripts/containers_lib/: engine.py (1), images.py (2, 3), stack.py (4-6), compose.py (7),
firewall.py (what an engine changes, put back), common.py (paths, names, log, sh).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

if __name__ == "__main__":  # re-run with the repository's .venv Python before importing from it
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from repo_venv import use_repo_venv

    use_repo_venv()


from containers_lib import engine as engines
from containers_lib.common import CACHE, LABEL, STARTED, STATE, P, StackError, answers, log, mounts_under, sh
from containers_lib.compose import compose_leftovers, remove_compose_leftovers, run_compose
from containers_lib.engine import pick_engine
from containers_lib.firewall import firewall_snapshot, restore_firewall
from containers_lib.images import HOST_CA, IMAGES, build_images, image, local_base, registry_answers
from containers_lib.stack import our_containers, remove_containers, run_stack


def run_tests(engine: str) -> dict[str, object]:
    """The integration tests inside a container with /dev/fuse (root, SYS_ADMIN)."""
    started = time.monotonic()
    # this machine's CA bundle: a few tests install an old chromadb with pip
    trust = ["-v", f"{HOST_CA}:{HOST_CA}:ro"] if HOST_CA.exists() else []
    # what `chromafs shell` needs in a container, so that its tests run here too: no seccomp
    # filter of the engine's (bwrap's unshare, pivot_root) and an unmasked /proc (a new proc
    # mount in a user namespace); docs/CONTAINERS.md, "chromafs shell inside a container"
    shell = ["--security-opt", "seccomp=unconfined",
             "--security-opt", "systempaths=unconfined" if engine == "docker" else "unmask=ALL"]  # fmt: skip
    done = subprocess.run(
        [engine, "run", "--rm", "--name", f"{P}-tests", "--label", f"{LABEL}=tests", "--device", "/dev/fuse",
         "--cap-add", "SYS_ADMIN", "--security-opt", "apparmor=unconfined", *shell, *trust, image("test"),
         "scripts/test"],
        check=False,
    )  # fmt: skip
    took = round(time.monotonic() - started, 1)
    return {"tests_in_container_s": took, "problems": [] if done.returncode == 0 else [f"tests failed ({took}s)"]}


def clean_previous(engine: str) -> None:
    """What a run killed halfway left behind: its containers (with their volumes), the compose
    project, its mounts and work directories. Removed, and said so."""
    names = our_containers(engine)
    if names:
        log(f"a previous run left {len(names)} containers: removing them")
        problems = remove_containers(engine, names, [])
        if problems:
            raise StackError("cannot remove what a previous run left: " + "; ".join(problems))
    if left := compose_leftovers(engine):
        log(f"a previous run left {', '.join(left)}: removing them")
        remove_compose_leftovers(engine)
    works = [str(d) for pattern in ("run-*", "compose-*") for d in CACHE.glob(pattern) if d.is_dir()]
    for mount in mounts_under(tuple(works)):
        sh(["umount", "-l", mount], check=False)
        log(f"unmounted {mount}, left by a previous run")
    for work in works:
        shutil.rmtree(work, ignore_errors=True)


def _terminated(signum: int, _frame: object) -> None:
    raise KeyboardInterrupt(f"signal {signum}")


def main() -> int:
    parser = argparse.ArgumentParser(prog="scripts/containers", description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--engine",
        choices=["auto", "docker", "podman"],
        default="auto",
        help="auto (default): docker if its daemon answers, else podman; docker: set up here if need be",
    )
    parser.add_argument("--tests", action="store_true", help="also run the integration tests in a container")
    parser.add_argument("--no-stack", action="store_true", help="only the images (and --tests)")
    parser.add_argument("--json", type=Path, help="write the figures here")
    parser.add_argument(
        "--if-possible", action="store_true", help="exit 0 with a note when no engine or base image can be set up"
    )
    args = parser.parse_args()
    if os.geteuid() != 0:
        print("scripts/containers: run as root (FUSE mounts, mount propagation, rootful containers)", file=sys.stderr)
        return 1
    signal.signal(signal.SIGTERM, _terminated)  # a killed run still tears down (then exits 130)
    signal.signal(signal.SIGHUP, _terminated)
    result: dict[str, object] = {"problems": []}

    def problem(*items: str) -> None:
        result["problems"] = [*result.get("problems", []), *items]  # type: ignore[misc]

    engine = None
    interrupted = False
    podman_firewall = STATE / "podman-firewall.json"  # what it was before this (or a killed) podman run
    try:
        try:
            try:
                engine = pick_engine(None if args.engine == "auto" else args.engine)
                if engine == "podman" and not podman_firewall.exists():
                    STATE.mkdir(parents=True, exist_ok=True)
                    podman_firewall.write_text(json.dumps(firewall_snapshot()))
                version = sh([engine, "--version"]).strip()
                if engine == "docker":
                    version += f"; server {sh(['docker', 'version', '--format', '{{.Server.Version}}']).strip()}"
                log(f"engine: {version}")
                result["engine"] = version
                base = None if registry_answers(engine) else local_base(engine)
            except (StackError, subprocess.CalledProcessError, OSError) as exc:
                if not args.if_possible:
                    raise StackError(f"no container engine and base image: {exc}") from exc
                log(f"skipping the containers: no engine and base image can be set up here: {exc}")
                return 0
            clean_previous(engine)
            log(f"base: {base or 'the Dockerfiles defaults (a registry answers)'}")
            names = [n for n in IMAGES if n != "test" or args.tests]
            if args.no_stack:
                names = ["test"] if args.tests else []
            result["build_s"] = build_images(engine, names, base)
            if not args.no_stack:
                result.update(run_stack(engine))
                compose = run_compose(engine)
                result["compose_s"] = compose["compose_s"]
                problem(*compose["problems"])  # type: ignore[arg-type]
            if args.tests:
                tests = run_tests(engine)
                result["tests_in_container_s"] = tests["tests_in_container_s"]
                problem(*tests["problems"])  # type: ignore[arg-type]
        except StackError as exc:
            problem(str(exc))
        except KeyboardInterrupt as exc:
            interrupted = True
            problem(f"interrupted ({exc or 'SIGINT'}): tearing down")
        finally:
            signal.signal(signal.SIGINT, signal.SIG_IGN)  # the teardown runs to its end
            signal.signal(signal.SIGTERM, signal.SIG_IGN)
            if engine is not None and answers([engine, "info"], timeout=60):
                if left := our_containers(engine):
                    problem(f"left behind: containers {', '.join(left)}")
                    problem(*remove_containers(engine, left, []))
                remove_compose_leftovers(engine)
            if engines.DAEMON is not None:
                problem(*engines.DAEMON.stop())
                engines.DAEMON = None
            # podman's CNI networks (builds, compose) leave their chains, DNS rules, bridges and
            # ip_forward behind: put them back once no podman container runs (none of another's)
            if engine == "podman" and podman_firewall.exists() and not sh(["podman", "ps", "-q"], check=False).strip():
                problem(*restore_firewall(json.loads(podman_firewall.read_text()), "this run"))
                podman_firewall.unlink()
                with contextlib.suppress(OSError):
                    STATE.rmdir()
    except StackError as exc:
        problem(str(exc))
    result["total_s"] = round(time.monotonic() - STARTED, 1)
    if args.json:
        args.json.write_text(json.dumps(result, indent=2) + "\n")
    problems = result.get("problems") or []
    for item in problems:  # type: ignore[union-attr]
        log(f"PROBLEM: {item}")
    log(f"{'failed' if problems else 'all checks passed'} in {result['total_s']:.0f}s: {json.dumps(result)}")
    return 130 if interrupted else 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
