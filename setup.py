"""The build's one step beyond pyproject.toml: the CSI stubs, generated from
chromafs_fuse/csi/proto/csi.proto into the built package (never into the source tree)."""

from __future__ import annotations

import importlib.util
import os

from setuptools import setup
from setuptools.command.build_py import build_py

HERE = os.path.dirname(os.path.abspath(__file__))


class BuildWithStubs(build_py):
    def run(self) -> None:
        super().run()
        if self.editable_mode:  # a source tree generates them at first import (chromafs_fuse/csi/stubs.py)
            return
        path = os.path.join(HERE, "chromafs_fuse", "csi", "proto", "generate.py")
        spec = importlib.util.spec_from_file_location("chromafs_csi_generate", path)
        assert spec is not None and spec.loader is not None
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        module.generate(self.build_lib)


setup(cmdclass={"build_py": BuildWithStubs})
