"""Generate the Python stubs of csi.proto (beside this file) with grpcio-tools' protoc.

Standard library and grpc_tools only: setup.py runs it at build time (`pip install .` ships the
stubs), and `chromafs_fuse.csi.stubs` at first import from a source tree. The stubs land in
`<out_root>/chromafs_fuse/csi/_generated/` (git-ignored): no generated code is committed, and no
hand-written module edits it. `python -m chromafs_fuse.csi.proto.generate [OUT_ROOT]` runs it.
"""

from __future__ import annotations

import os
import shutil
import sys
import tempfile

PACKAGE = ("chromafs_fuse", "csi", "_generated")
PROTO = os.path.join(os.path.dirname(os.path.abspath(__file__)), "csi.proto")
HEADER = '"""Generated from chromafs_fuse/csi/proto/csi.proto by generate.py: do not edit, do not commit."""\n'


def generate(out_root: str) -> str:
    """Write csi_pb2.py and csi_pb2_grpc.py (and an __init__.py) under `out_root`; their folder.
    The proto is compiled as `chromafs_fuse/csi/_generated/csi.proto`, so the stubs import each
    other by their package path."""
    from grpc_tools import protoc  # build-time tool: imported only when stubs are made

    target = os.path.join(out_root, *PACKAGE)
    os.makedirs(target, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="chromafs-csi-proto-") as staging:
        staged = os.path.join(staging, *PACKAGE, "csi.proto")
        os.makedirs(os.path.dirname(staged))
        shutil.copyfile(PROTO, staged)
        with tempfile.TemporaryDirectory(prefix="chromafs-csi-out-", dir=out_root) as out:
            includes = os.path.join(os.path.dirname(protoc.__file__), "_proto")  # google/protobuf/*.proto
            argv = ["protoc", f"-I{staging}", f"-I{includes}", f"--python_out={out}", f"--grpc_python_out={out}"]
            if protoc.main([*argv, os.path.join(*PACKAGE, "csi.proto")]) != 0:
                raise RuntimeError(f"protoc could not compile {PROTO}")
            made = os.path.join(out, *PACKAGE)
            with open(os.path.join(made, "__init__.py"), "w") as f:
                f.write(HEADER)
            for name in ("csi_pb2_grpc.py", "__init__.py", "csi_pb2.py"):  # csi_pb2.py last: it marks "done"
                os.replace(os.path.join(made, name), os.path.join(target, name))
    return target


if __name__ == "__main__":
    package_root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(PROTO))))
    root = sys.argv[1] if len(sys.argv) > 1 else package_root
    print(generate(root))
