"""Errors a user can act on (issue 38): each command's message says what happened, to which file,
site or flag, and what to do; none has a traceback, an exception class name or a repr, and a
failing read-only command writes nothing."""

from __future__ import annotations

import re
import subprocess
from collections.abc import Callable
from pathlib import Path

import pytest

from infra import BIN, SAMPLE_SITE, Backend, ChromaServer, MountServer, ingest, try_mount

SECRET = "error-messages-secret-0123456789abcdef"
CLASS_NAME = re.compile(r"\b[A-Z][a-zA-Z]+(Error|Exception)\b|Traceback|\bDecodeError\b")
REPR = re.compile(r"PosixPath\(|<[a-zA-Z_.]+ object at|\bb'|\\x[0-9a-f]{2}")


def readable(message: str) -> None:
    assert message.strip(), "no message at all"
    assert not CLASS_NAME.search(message), f"an exception class or traceback: {message}"
    assert not REPR.search(message), f"a repr: {message}"


def chromafs(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(BIN / "chromafs"), *args], capture_output=True, text=True, timeout=120)


@pytest.fixture
def secret(tmp_path: Path) -> Path:
    path = tmp_path / "secret"
    path.write_text(SECRET)
    return path


def test_a_token_file_that_is_not_a_jwt_says_so(
    sample_backend: Callable[..., Backend], secret: Path, mnt: Path, tmp_path: Path
) -> None:
    token = tmp_path / "token"
    token.write_text("hello, this is not a token\n")
    done = try_mount(mnt, *sample_backend().args, "--token-file", str(token), "--jwt-secret-file", str(secret))
    assert done.returncode == 1
    assert "the token is not a JWT" in done.stderr and "check the token file" in done.stderr
    readable(done.stderr)


@pytest.mark.parametrize("command", ["mount", "grep", "search", "status-free"])
def test_a_mistyped_chroma_path_names_it_and_creates_nothing(command: str, mnt: Path, tmp_path: Path) -> None:
    """`--chroma-path` naming a directory with no Chroma database: every reader says so and leaves
    the directory as it was (chromadb would create a 188 KB database there)."""
    typo = tmp_path / "chromma"
    typo.mkdir()
    args = ["--site", "acme", "--chroma-path", str(typo)]
    if command == "mount":
        done = try_mount(mnt, *args, "--no-mountd")
    elif command == "grep":
        done = chromafs("grep", *args, "token", "/")
    elif command == "search":
        done = chromafs("search", *args, "refresh token")
    else:
        missing = tmp_path / "nothing-here"
        done = try_mount(mnt, "--site", "acme", "--chroma-path", str(missing), "--no-mountd")
        assert not missing.exists(), "a read created the directory"
        typo = missing
    assert done.returncode != 0
    assert f"no Chroma database at {typo}" in done.stderr, done.stderr
    readable(done.stderr)
    assert not typo.exists() or list(typo.iterdir()) == [], "a read wrote into the directory"


def test_groups_with_bytes_that_are_not_utf8_are_named_and_hide_the_page(tmp_path: Path) -> None:
    """A `groups:` value with an undecodable byte: the page is hidden from everyone (fail closed)
    and an error names the file, its line and the value."""
    site = tmp_path / "site"
    site.mkdir()
    (site / "index.md").write_text("# Home\n")
    (site / "admin.md").write_bytes(b"---\ntitle: Admin\ngroups: [adm\xffin]\n---\n# Admin\n")
    done = ingest(site, "--site", "odd", "--chroma-path", str(tmp_path / "chroma"), status=3)
    line = next(line for line in done.stderr.splitlines() if line.startswith("error: admin.md"))
    assert line.startswith("error: admin.md:3:") and "'groups'" in line and "not UTF-8" in line, line
    assert "hidden from everyone" in line
    readable(line)


def test_the_sample_sites_ingest_and_mount_errors_are_readable(
    sample_backend: Callable[..., Backend], secret: Path, mnt: Path, tmp_path: Path
) -> None:
    """Common mistakes, each one line that names what to fix."""
    backend = sample_backend().args
    cases = {
        "no such site": try_mount(mnt, *[*backend[:1], "nosuchsite", *backend[2:]], "--no-mountd"),
        "not a directory": try_mount(tmp_path / "missing", *backend, "--no-mountd"),
        "no key for a token": try_mount(mnt, *backend, "--token", "a.b.c", "--no-mountd"),
        "ingest of a missing folder": subprocess.run(
            [
                str(BIN / "chromafs-ingest"),
                str(tmp_path / "no-docs"),
                "--site",
                "acme",
                "--chroma-path",
                str(tmp_path / "c"),
            ],
            capture_output=True,
            text=True,
            timeout=120,
        ),
    }
    for what, done in cases.items():
        assert done.returncode != 0, what
        readable(done.stderr)
    assert not (tmp_path / "c").exists(), "an ingest that read nothing created its Chroma directory"


def test_each_problem_file_gets_one_line_with_its_final_outcome(tmp_path: Path) -> None:
    """A page that is not UTF-8 and whose access cannot be read: one line, and one entry in the
    report, saying it is hidden from everyone (not a warning that it was served, then an error)."""
    import json

    site = tmp_path / "site"
    site.mkdir()
    (site / "index.md").write_text("# Home\n")
    (site / "odd.md").write_bytes(b"---\npublic: f\xfflse\n---\n# Odd\n")
    report = tmp_path / "report.json"
    done = ingest(site, "--site", "odd", "--chroma-path", str(tmp_path / "chroma"), "--report", str(report), status=3)
    lines = [line for line in done.stderr.splitlines() if "odd.md" in line]
    assert len(lines) == 1, done.stderr
    assert lines[0].startswith("error: odd.md:2: ") and lines[0].endswith("(hidden from everyone)"), lines[0]
    readable(lines[0])
    problems = [p for p in json.loads(report.read_text())["problems"] if p["path"] == "odd.md"]
    assert len(problems) == 1 and problems[0]["outcome"] == "hidden from everyone"


def test_each_command_words_a_bad_flag_or_an_unusable_path(tmp_path: Path) -> None:
    """chromafs-mountd, chromafs-ingest and chromafs: a flag or path they cannot use, one line each."""
    chroma = tmp_path / "chroma"
    ingest(SAMPLE_SITE, "--site", "acme", "--chroma-path", str(chroma), "--quiet")

    def run(*argv: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([str(BIN / argv[0]), *argv[1:]], capture_output=True, text=True, timeout=120)

    site = ["--site", "acme", "--chroma-path", str(chroma)]
    cases = {
        "mountd on a socket path it cannot make": (
            run("chromafs-mountd", "--socket", "/proc/no-such-dir/mountd.sock"),
            "/proc/no-such-dir",
        ),
        "mountd pool out of range": (run("chromafs-mountd", "--serving-processes", "999"), "--serving-processes"),
        "ingest blob store": (
            run("chromafs-ingest", str(SAMPLE_SITE), *site, "--blob-store", "ftp://nowhere"),
            "ftp://nowhere",
        ),
        "grep with a bad pattern": (run("chromafs", "grep", *site, "("), "bad pattern"),
        "grep with a bad Redis URL": (run("chromafs", "grep", *site, "--redis-url", "bad://x", "token"), "--redis-url"),
        "search of a site that is not there": (
            run("chromafs", "search", "--site", "nosuch", "--chroma-path", str(chroma), "q"),
            "nosuch",
        ),
    }
    for what, (done, named) in cases.items():
        assert done.returncode != 0, what
        assert named in done.stderr, f"{what}: {done.stderr}"
        last = done.stderr.strip().splitlines()[-1]  # argparse's usage lines come first
        assert named in last and "Traceback" not in done.stderr, f"{what}: {done.stderr}"
        readable(last)


@pytest.mark.expect_log(r"(ERROR|WARNING) .*(cannot open Chroma at .*: no answer|mount request from uid)")
@pytest.mark.parametrize("path", ["alone", "mount server"])
def test_every_reader_mistake_is_one_readable_line(
    path: str,
    sample_backend: Callable[..., Backend],
    secret_file: Path,
    make_token: Callable[..., str],
    start_mount_server: Callable[..., object],
    tmp_path: Path,
) -> None:
    """The mistakes a reader makes, through `chromafs-mount` alone and through the host's mount
    server: each fails with one line naming what to fix, and nothing is left mounted."""
    import time

    from infra import free_port, is_mounted

    backend = sample_backend().args
    where = ["--no-mountd"] if path == "alone" else ["--mountd", str(start_mount_server().socket)]  # type: ignore[attr-defined]
    keys = ["--jwt-secret-file", str(secret_file)]

    def token(**claims: object) -> list[str]:
        file = tmp_path / f"token-{len(list(tmp_path.glob('token-*')))}"
        file.write_text(make_token(**claims))
        return ["--token-file", str(file), *keys]

    a_file = tmp_path / "a-file"
    a_file.write_text("not a directory\n")
    busy = tmp_path / "busy"
    busy.mkdir()
    dead_chroma = f"http://127.0.0.1:{free_port()}"
    cases: dict[str, tuple[Path, list[str], str]] = {
        "an expired token": (tmp_path / "m1", [*backend, *token(exp=int(time.time()) - 60)], "expired"),
        "another site's token": (tmp_path / "m2", [*backend, *token(site="acme-staging")], "acme-staging"),
        "a token signed with another key": (
            tmp_path / "m3",
            [*backend, "--token", jwt_signed_elsewhere(), *keys],
            "signature",
        ),
        "a missing token file": (
            tmp_path / "m4",
            [*backend, "--token-file", str(tmp_path / "no-token"), *keys],
            str(tmp_path / "no-token"),
        ),
        "a Chroma server that is down": (
            tmp_path / "m5",
            ["--site", "acme", "--chroma-url", dead_chroma, "--backend-timeout", "2"],
            dead_chroma.removeprefix("http://"),
        ),
        "a mountpoint that is a file": (a_file, backend, str(a_file)),
    }
    for what, (mountpoint, args, named) in cases.items():
        if mountpoint != a_file:
            mountpoint.mkdir(exist_ok=True)
        done = try_mount(mountpoint, *args, *where)
        assert done.returncode != 0, f"{what}: mounted"
        lines = done.stderr.strip().splitlines()
        assert len(lines) == 1, f"{what}: {done.stderr}"
        assert named in lines[0], f"{what}: {lines[0]}"
        readable(lines[0])
        assert not is_mounted(mountpoint), f"{what}: left mounted"


def jwt_signed_elsewhere() -> str:
    import jwt

    claims = {"sub": "x", "site": "acme", "exp": 2_000_000_000}
    return jwt.encode(claims, "another-secret-0123456789abcdef0123", "HS256")


def test_ingest_and_readers_say_which_backend_is_down(tmp_path: Path) -> None:
    """A Chroma or Redis that does not answer, and a source that is not a folder: one line naming
    the URL or the path, for the ingest and for `chromafs grep`/`search`; nothing is created."""
    from infra import free_port

    def run(*argv: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([str(BIN / argv[0]), *argv[1:]], capture_output=True, text=True, timeout=180)

    dead_chroma = f"127.0.0.1:{free_port()}"
    dead_redis = f"127.0.0.1:{free_port()}"
    chroma = tmp_path / "chroma"
    ingest(SAMPLE_SITE, "--site", "acme", "--chroma-path", str(chroma), "--quiet")
    a_file = tmp_path / "page.md"
    a_file.write_text("# a page\n")
    cases = {
        "ingest into a Chroma that is down": (
            run("chromafs-ingest", str(SAMPLE_SITE), "--site", "acme", "--chroma-url", f"http://{dead_chroma}"),
            dead_chroma,
        ),
        "ingest with a Redis that is down (its Chroma written: exit 0, a warning)": (
            run(
                "chromafs-ingest",
                str(SAMPLE_SITE),
                "--site",
                "acme",
                "--chroma-path",
                str(tmp_path / "other"),
                "--redis-url",
                f"redis://{dead_redis}/0",
            ),
            dead_redis,
        ),
        "ingest of a file, not a folder": (
            run("chromafs-ingest", str(a_file), "--site", "acme", "--chroma-path", str(tmp_path / "third")),
            str(a_file),
        ),
        "grep of a Chroma that is down": (
            run("chromafs", "grep", "--site", "acme", "--chroma-url", f"http://{dead_chroma}", "token", "/"),
            dead_chroma,
        ),
        "search of a Chroma that is down": (
            run("chromafs", "search", "--site", "acme", "--chroma-url", f"http://{dead_chroma}", "token"),
            dead_chroma,
        ),
    }
    for what, (done, named) in cases.items():
        assert done.returncode == (0 if "exit 0" in what else 1 if "ingest" in what else 2), f"{what}: {done.stderr}"
        last = done.stderr.strip().splitlines()[-1]
        assert named in last, f"{what}: {done.stderr}"
        assert "Traceback" not in done.stderr, f"{what}: {done.stderr}"
        readable(last)
    assert not (tmp_path / "third").exists(), "an ingest that read nothing created its Chroma directory"


@pytest.mark.expect_log(r"WARNING .*session on .* refused: no site 'acmee'")
@pytest.mark.parametrize("through", ["alone", "mount server", "chroma server"])
def test_a_mistyped_site_is_named_first_with_the_sites_that_exist(
    through: str,
    sample_backend: Callable[..., Backend],
    chroma_server: ChromaServer,
    start_mount_server: Callable[..., MountServer],
    token_file: Callable[..., Path],
    secret_file: Path,
    mnt: Path,
    tmp_path: Path,
) -> None:
    """`--site acmee` with a valid token of site `acme`: the site that does not exist is the problem
    (not the token), and the sites that do are listed with the nearest one."""
    token = ["--token-file", str(token_file(["billing"])), "--jwt-secret-file", str(secret_file)]
    if through == "chroma server":
        chroma = ["--chroma-url", chroma_server.url]
        ingest(SAMPLE_SITE, "--site", "acme-http", *chroma, "--quiet")
        done = try_mount(mnt, "--site", "acme-http-docs", *chroma, "--no-mountd")
        assert done.returncode == 1
        assert done.stderr.startswith(
            f"chromafs-mount: no site 'acme-http-docs' in Chroma at {chroma_server.url}: no collection "
            "'acme-http-docs'; the sites there: "
        ), done.stderr
        assert "acme-http" in done.stderr.split("the sites there: ")[1]
        assert done.stderr.rstrip().endswith("(did you mean 'acme-http'?)"), done.stderr
        readable(done.stderr)
        return
    backend = sample_backend()
    args = ["--site", "acmee", "--chroma-path", str(backend.chroma_path), *token]
    if through == "mount server":
        args += ["--mountd", str(start_mount_server().socket)]
    else:
        args += ["--no-mountd"]
    done = try_mount(mnt, *args)
    assert (done.returncode, done.stderr) == (
        1,
        f"chromafs-mount: no site 'acmee' in Chroma at embedded:{backend.chroma_path}: no collection 'acmee'; "
        "the sites there: acme (did you mean 'acme'?)\n",
    )
    # the site exists: the token's site is the problem, as before
    other = try_mount(mnt, *backend.args, "--token-file", str(token_file(site="mcp")), "--jwt-secret-file",
                      str(secret_file), "--no-mountd")  # fmt: skip
    assert other.stderr == (
        "chromafs-mount: token is for site 'mcp', not 'acme': check --site, or use a token of site 'acme'\n"
    )
