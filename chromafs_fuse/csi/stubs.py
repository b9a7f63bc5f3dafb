"""The CSI messages and services, from the stubs generated out of csi.proto.

An installed package carries them (setup.py generates them at build time); a source tree gets
them at first import, generated into the git-ignored `chromafs_fuse/csi/_generated/`.
"""

from __future__ import annotations

import importlib
import os
import threading
from types import ModuleType

from chromafs_fuse.errors import UsageError

_LOCK = threading.Lock()


def _generated(name: str) -> ModuleType:
    return importlib.import_module(f"chromafs_fuse.csi._generated.{name}")


def load() -> tuple[ModuleType, ModuleType]:
    """(csi_pb2, csi_pb2_grpc), generated first when this tree has none."""
    with _LOCK:
        try:
            return _generated("csi_pb2"), _generated("csi_pb2_grpc")
        except ModuleNotFoundError:
            pass
        from chromafs_fuse.csi.proto.generate import generate

        package_root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
        try:
            generate(package_root)
        except ModuleNotFoundError as exc:
            missing = "the CSI stubs are missing and grpcio-tools is not installed: pip install grpcio-tools"
            raise UsageError(missing) from exc
        except OSError as exc:
            raise UsageError(
                f"cannot write the CSI stubs in {package_root} ({exc.strerror}): run "
                "`python -m chromafs_fuse.csi.proto.generate` once as a user who may write there"
            ) from exc
        importlib.invalidate_caches()
        return _generated("csi_pb2"), _generated("csi_pb2_grpc")


pb, rpc = load()
