"""Running like a system service: systemd units, the mount(8) helper, readiness
notification, `chromafs status` and the metrics endpoint."""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import urllib.request
from collections.abc import Callable
from pathlib import Path

import pytest

from chromafs_fuse.cli.mount import build_parser
from chromafs_fuse.cli.mount_helper import RENAMED, mount_flags, translate
from chromafs_fuse.serving.mounttable import escape, unescape
from chromafs_fuse.serving.process import process_start
from chromafs_fuse.serving.status import read_statuses, runtime_dir
from infra import BIN, MOUNT, REPO, SAMPLE_SITE, Backend, free_port, is_mounted, mounted, unmount, wait_until


@pytest.mark.skipif(shutil.which("systemd-analyze") is None, reason="systemd-analyze not installed")
@pytest.mark.parametrize("unit", ["chromafs@.service", "chromafs-mountd.service", "chromafs-ingest@.service"])
def test_units_pass_systemd_analyze_verify(unit: str, tmp_path: Path) -> None:
    text = (REPO / "systemd" / unit).read_text().replace("/usr/local/bin/", f"{BIN}/")
    conf = tmp_path / "acme.conf"
    conf.write_text((REPO / "systemd" / "chromafs.conf.example").read_text())
    text = text.replace("/etc/chromafs/%i.conf", str(conf)).replace("/etc/chromafs/ingest-%i.conf", str(conf))
    target = tmp_path / unit.replace("@.", "@acme.")
    target.write_text(text)
    proc = subprocess.run(["systemd-analyze", "verify", str(target)], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert proc.stderr.strip() == "" and proc.stdout.strip() == "", proc.stderr + proc.stdout


@pytest.mark.skipif(os.geteuid() != 0, reason="installing a mount helper needs root")
def test_mount_t_fuse_chromafs_and_fstab(sample_chroma: Callable[[str], Path], mnt: Path, tmp_path: Path) -> None:
    helper = Path("/sbin/mount.fuse.chromafs")
    created = not helper.exists()
    if created:
        helper.symlink_to(BIN / "mount.fuse.chromafs")
    chroma = sample_chroma("public")
    try:
        proc = subprocess.run(
            [
                "mount",
                "-t",
                "fuse.chromafs",
                "acme",
                str(mnt),
                "-o",
                f"chroma_path={chroma},prefetch=off,_netdev,nodev",
            ],
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert proc.returncode == 0, proc.stderr
        assert (mnt / "auth" / "oauth.mdx").read_bytes() == (SAMPLE_SITE / "auth" / "oauth.mdx").read_bytes()
        assert subprocess.run(["umount", str(mnt)], timeout=30).returncode == 0
        assert not is_mounted(mnt)
        fstab = tmp_path / "fstab"
        options = f"chroma_path={chroma},readahead_pages=0,no_push_pages,noauto,_netdev"
        fstab.write_text(f"acme {mnt} fuse.chromafs {options} 0 0\n")
        proc = subprocess.run(["mount", "-T", str(fstab), str(mnt)], capture_output=True, text=True, timeout=60)
        assert proc.returncode == 0, proc.stderr
        assert (mnt / "index.mdx").is_file()
        refused = subprocess.run(
            ["mount", "-t", "fuse.chromafs", "acme", str(tmp_path), "-o", "token=abc"],
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert refused.returncode != 0 and "token_file" in refused.stderr
    finally:
        unmount(mnt)
        if created:
            helper.unlink()


def test_foreground_daemon_notifies_systemd_and_stops_cleanly(
    sample_backend: Callable[..., Backend], mnt: Path, tmp_path: Path
) -> None:
    notify_path = tmp_path / "notify.sock"
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    listener.bind(str(notify_path))
    listener.settimeout(60)
    env = {**os.environ, "NOTIFY_SOCKET": str(notify_path)}
    daemon = subprocess.Popen(
        [MOUNT, "--foreground", str(mnt), *sample_backend().args],
        env=env,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        ready = listener.recv(4096).decode()
        assert ready.startswith("READY=1")
        assert is_mounted(mnt) and (mnt / "index.mdx").is_file()  # ready means answering
        daemon.send_signal(signal.SIGTERM)
        assert listener.recv(4096).decode() == "STOPPING=1"
        assert daemon.wait(30) == 0
        assert not is_mounted(mnt)
    finally:
        listener.close()
        if daemon.poll() is None:
            daemon.kill()
        unmount(mnt)
    assert "unmounted" in daemon.stderr.read()  # type: ignore[union-attr]


def test_status_and_metrics(
    sample_backend: Callable[..., Backend], mnt: Path, make_token: Callable[..., str], secret_file: Path
) -> None:
    port = free_port()
    token = make_token(["billing"])
    with mounted(
        mnt,
        *sample_backend().args,
        "--token",
        token,
        "--jwt-secret-file",
        str(secret_file),
        "--metrics-addr",
        f"127.0.0.1:{port}",
    ):
        (mnt / "api-reference" / "payments.mdx").read_bytes()

        def status_after_a_read() -> tuple[dict, str] | None:
            out = subprocess.run(
                [str(BIN / "chromafs"), "status", "--json"], capture_output=True, text=True, timeout=60
            )
            assert out.returncode == 0
            mine = [s for s in json.loads(out.stdout) if s["mountpoint"] == str(mnt)]
            assert len(mine) == 1
            return (mine[0], out.stdout) if mine[0].get("requests", {}).get("read") else None

        # the status file is refreshed every few seconds
        status, printed = wait_until(status_after_a_read, 15, "a read counted in the status file", 0.5)
        assert status["site"] == "acme" and "groups=billing" in status["reader"]
        assert status["visible_files"] > 0 and status["requests"]["read"] >= 1
        assert token not in printed
        table = subprocess.run([str(BIN / "chromafs"), "status"], capture_output=True, text=True, timeout=60)
        assert str(mnt) in table.stdout and "acme" in table.stdout
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as response:
            metrics = response.read().decode()
        assert 'chromafs_requests_total{op="read"}' in metrics
        assert "chromafs_read_seconds_bucket" in metrics
        assert 'chromafs_request_seconds_bucket{le="+Inf",op="open"}' in metrics
        assert 'chromafs_cache_lookups_total{result="hit",tier="memory"}' in metrics
        assert "process_resident_memory_bytes" in metrics  # the process's own figures, as prometheus_client names them
        assert token not in metrics
    gone = subprocess.run([str(BIN / "chromafs"), "status", "--json"], capture_output=True, text=True, timeout=60)
    assert str(mnt) not in gone.stdout


def test_daemon_log_is_private(sample_backend: Callable[..., Backend], mnt: Path) -> None:
    with mounted(mnt, *sample_backend().args):
        log = mnt.parent / "mnt.log"
        assert log.stat().st_mode & 0o777 == 0o600  # it names pages and groups: not for other local users


def test_status_files_left_by_killed_daemons_are_ignored_and_removed() -> None:
    """A SIGKILLed daemon leaves its status file; its pid may later belong to another process.
    `chromafs status` must not show such a file for a live mount, and removes it."""
    directory = Path(runtime_dir())
    dead = subprocess.Popen(["true"])
    dead.wait()
    files = {
        "dead pid": (directory / f"{dead.pid}.json", {"pid": dead.pid, "pid_start": 1}),
        "pid reused": (directory / f"{os.getpid()}.json", {"pid": os.getpid(), "pid_start": 1}),
    }
    alive = subprocess.Popen(["sleep", "60"])  # (not our parent: in a container pytest may be pid 1)
    live = directory / f"{alive.pid}.json"
    assert not live.exists()
    try:
        for path, status in files.values():
            path.write_text(json.dumps({**status, "mountpoint": "/nowhere"}))
        live.write_text(json.dumps({"pid": alive.pid, "pid_start": process_start(alive.pid)}))
        read_statuses()
        assert [label for label, (path, _) in files.items() if path.exists()] == []
        assert live.exists()  # its process is still the one that wrote it
    finally:
        alive.kill()
        alive.wait()
        for path in [live, *(path for path, _ in files.values())]:
            path.unlink(missing_ok=True)


def test_mount_table_paths_with_spaces_and_non_ascii(sample_backend: Callable[..., Backend], tmp_path: Path) -> None:
    assert unescape(b"/mnt/d\\040\xc3\xa9\\011x\\134y") == "/mnt/d é\tx\\y"
    assert escape("/mnt/d é\tx\\y") == "/mnt/d\\040é\\011x\\134y"
    point = tmp_path / "docs é ü"
    with mounted(point, *sample_backend().args):
        assert is_mounted(point)
        out = subprocess.run([str(BIN / "chromafs"), "status", "--json"], capture_output=True, text=True, timeout=60)
        assert [s["mountpoint"] for s in json.loads(out.stdout) if s["mountpoint"] == str(point)] == [str(point)]
    assert not is_mounted(point)


def test_every_mount_flag_is_a_mount_option() -> None:
    """The helper's options come from chromafs-mount's own parser: none can drift to FUSE's -o."""
    valued, switches = mount_flags()
    parser = build_parser()
    for name in sorted(valued):
        argv = translate("acme", "/mnt/docs", f"{name}=7")
        flag = f"--{name.replace('_', '-')}"
        assert argv[3:5] == [RENAMED.get(flag, flag), "7"], name  # an old name becomes the new one
        assert "-o" not in argv
    for name in sorted(switches):
        argv = translate("acme", "/mnt/docs", name)
        assert argv[3:] == [f"--{name.replace('_', '-')}"], name
        parser.parse_args(argv)
    assert {"readahead_pages", "prefetch_max_bytes", "chunk_joiner"} <= valued and "no_push_pages" in switches
    assert translate("acme", "/mnt/docs", "allow_other,noauto,x-systemd.idle-timeout=5")[3:] == ["-o", "allow_other"]
