"""The firewall an engine changes, saved and put back: iptables and ip6tables (table by table,
compared without counters), the engines' bridges, ip_forward and the bridge sysctls, and the
/run/netns mount CNI makes. A snapshot is taken before dockerd (or a podman run) starts and
restored after it stops."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

from containers_lib.common import log, mounts_under, sh

# The firewall dockerd changes: the nat and filter tables (its DOCKER* chains, MASQUERADE,
# FORWARD's policy), ip_forward, and the docker0 bridge. Snapshot before it starts, put back
# after it stops.
SYSCTLS = ("net/ipv4/ip_forward", "net/bridge/bridge-nf-call-iptables", "net/bridge/bridge-nf-call-ip6tables")
BUILTIN_CHAINS = {
    "filter": ("INPUT", "FORWARD", "OUTPUT"),
    "nat": ("PREROUTING", "INPUT", "OUTPUT", "POSTROUTING"),
    "mangle": ("PREROUTING", "INPUT", "FORWARD", "OUTPUT", "POSTROUTING"),
    "raw": ("PREROUTING", "OUTPUT"),
    "security": ("INPUT", "FORWARD", "OUTPUT"),
}


def iptables_tables(text: str) -> dict[str, str]:
    """iptables-save's output, table by table (each from `*table` to `COMMIT`)."""
    tables: dict[str, list[str]] = {}
    current: list[str] | None = None
    for line in text.splitlines():
        if line.startswith("*"):
            current = tables.setdefault(line[1:].strip(), [])
        if current is not None and line.strip() and not line.startswith("#"):
            current.append(line.strip())
        if line.strip() == "COMMIT":
            current = None
    return {name: "\n".join(lines) + "\n" for name, lines in tables.items()}


def iptables_rules(text: str) -> dict[str, tuple[tuple[tuple[str, str], ...], tuple[str, ...]]]:
    """The rules of iptables-save's output, without counters: table -> (chains with their
    policies, rules). A table with only its built-in chains, accepting, and no rule counts as
    no table (iptables-restore cannot delete a table)."""
    out = {}
    for name, section in iptables_tables(text).items():
        chains = tuple(sorted(tuple(line[1:].split()[:2]) for line in section.splitlines() if line.startswith(":")))
        rules = tuple(line for line in section.splitlines() if line.startswith("-"))
        builtin = BUILTIN_CHAINS.get(name, ())
        if rules or any(chain not in builtin or policy != "ACCEPT" for chain, policy in chains):
            out[name] = (chains, rules)
    return out


def empty_table(name: str) -> str:
    return f"*{name}\n" + "".join(f":{chain} ACCEPT [0:0]\n" for chain in BUILTIN_CHAINS.get(name, ())) + "COMMIT\n"


def firewall_snapshot() -> dict[str, object]:
    tables = {tool: sh([f"{tool}-save"], check=False, quiet=True) for tool in ("iptables", "ip6tables")
              if shutil.which(f"{tool}-save")}  # fmt: skip
    proc = Path("/proc/sys")
    sysctls = {key: (proc / key).read_text().strip() for key in SYSCTLS if (proc / key).exists()}
    links = sorted(os.listdir("/sys/class/net"))
    # (os.path.ismount misses /run/netns: CNI binds it onto itself, on the same filesystem)
    return {"tables": tables, "sysctls": sysctls, "links": links, "netns_mount": bool(mounts_under(("/run/netns",)))}


# the bridges engines make: docker's, and podman's CNI networks (one per network, cni-podmanN)
ENGINE_LINKS = ("docker0", "br-", "veth", "cni-podman")


def restore_firewall(before: dict[str, object], who: str = "dockerd started") -> list[str]:
    """Put the firewall back as `before` had it (iptables, ip6tables, the engines' bridges,
    ip_forward, and the /run/netns mount CNI makes); what could not be."""
    problems = []
    for tool, text in before["tables"].items():  # type: ignore[attr-defined]
        now = sh([f"{tool}-save"], check=False, quiet=True)
        if iptables_rules(now) == iptables_rules(text):
            continue
        was = iptables_tables(text)
        script = "".join(was.get(name) or empty_table(name) for name in sorted(set(iptables_tables(now)) | set(was)))
        done = subprocess.run([f"{tool}-restore"], input=script, capture_output=True, text=True, check=False)
        after = sh([f"{tool}-save"], check=False, quiet=True)
        if done.returncode != 0 or iptables_rules(after) != iptables_rules(text):
            problems.append(f"{tool} is not as it was before {who}: {done.stderr.strip()[-300:]}")
        else:
            log(f"{tool}: the rules are as they were before {who}")
    for link in sorted(set(os.listdir("/sys/class/net")) - set(before["links"])):  # type: ignore[arg-type]
        if link.startswith(ENGINE_LINKS):
            sh(["ip", "link", "delete", link], check=False)
    if before.get("netns_mount") is False and mounts_under(("/run/netns",)) and not os.listdir("/run/netns"):
        sh(["umount", "/run/netns"], check=False)
    for key, value in before["sysctls"].items():  # type: ignore[attr-defined]
        path = Path("/proc/sys") / key
        if path.exists() and path.read_text().strip() != value:
            path.write_text(value + "\n")
    left = sorted(set(os.listdir("/sys/class/net")) - set(before["links"]))  # type: ignore[arg-type]
    problems += [f"network interface {link} is left" for link in left]
    return problems
