"""A process already inside a mount, as a shell of an agent is: it makes DIRECTORY its working
directory, lists it and reads one page (so the kernel caches them), says `ready`, waits until
`--at`, then tries what a shell does there and prints each attempt's errno (0: it worked) as one
JSON line: `ls .`, `cat` of the page it read, `cat` of a page it never read, `cd` into a
subdirectory. Standard library only: it runs in another mount namespace (`unshare -m`) or as
another user as it is.

    python inside.py DIRECTORY --read PAGE --unread PAGE --subdir DIR --at EPOCH
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from collections.abc import Callable


def attempt(action: Callable[[], object]) -> int:
    try:
        action()
    except OSError as exc:
        return exc.errno or -1
    return 0


def read(path: str) -> bytes:
    with open(path, "rb") as f:
        return f.read()


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("directory")
    parser.add_argument("--read", required=True)
    parser.add_argument("--unread", required=True)
    parser.add_argument("--subdir", required=True)
    parser.add_argument("--at", type=float, required=True)
    args = parser.parse_args()
    os.chdir(args.directory)
    os.listdir(".")
    read(args.read)
    print("ready", flush=True)
    time.sleep(max(0.0, args.at - time.time()))
    results = {
        "ls": attempt(lambda: os.listdir(".")),
        "cat_read": attempt(lambda: read(args.read)),
        "cat_unread": attempt(lambda: read(args.unread)),
        "cd": attempt(lambda: os.chdir(args.subdir)),
    }
    print(json.dumps(results), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
