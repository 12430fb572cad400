"""The solver's kernels compiled at install (numba's pycc) into ``perseus.solver._kernels``, so
that no run waits for numba (:mod:`perseus.solver.aot`). Optional: where it cannot be built (no
C compiler, say) the install goes on and numba compiles the kernels on first use instead.
Everything else about the package is in pyproject.toml.
"""

from __future__ import annotations

import importlib
import os
import sys
import tempfile
import types
import warnings
from pathlib import Path
from typing import Any

from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext

ROOT = Path(__file__).resolve().parent
MODULE = "perseus.solver._kernels"


class BuildKernels(build_ext):
    """build_ext that compiles the kernels with numba instead of building C sources."""

    def build_extension(self, ext: Extension) -> None:
        target = Path(self.get_ext_fullpath(ext.name))
        try:
            _compile_kernels(target)
        except Exception as e:  # optional: numba compiles on first use instead
            print(
                f"perseus: solver kernels not compiled ahead of time ({type(e).__name__}: {e}); "
                "numba will compile them on first use",
                file=sys.stderr,
            )


def _compile_kernels(target: Path) -> None:
    # numba's disk cache of the kernels' callees goes to a scratch folder, not the source tree.
    os.environ["NUMBA_CACHE_DIR"] = tempfile.mkdtemp(prefix="perseus-build-")
    # The kernels' modules need numpy and numba only: load them without perseus/__init__.py.
    for name in ("perseus", "perseus.solver"):
        package = types.ModuleType(name)
        package.__path__ = [str(ROOT.joinpath(*name.split(".")))]
        sys.modules.setdefault(name, package)
    sys.modules[MODULE] = None  # type: ignore[assignment]  # not an earlier build's kernels
    aot = importlib.import_module("perseus.solver.aot")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # pycc is pending deprecation (numba 0.57+)
        from llvmlite import binding
        from numba.pycc import CC, compiler

    class ReleasingGil(compiler.Flags):  # type: ignore[misc, name-defined]
        """The native kernels release the GIL, as the JIT ones do (``nogil=True``)."""

        def __init__(self, *args: Any, **kwargs: Any) -> None:
            super().__init__(*args, **kwargs)
            self.release_gil = True

    cc = CC(target.name.split(".")[0])
    target.parent.mkdir(parents=True, exist_ok=True)
    cc.output_dir, cc.output_file = str(target.parent), target.name
    cc.target_cpu = binding.get_host_cpu_name()  # built where it runs, as numba's JIT would
    for name, (module, kinds) in aot.KERNELS.items():
        kernel = getattr(importlib.import_module(f"perseus.solver.{module}"), name)
        cc.export(name, aot.numba_types(kinds))(kernel.py_func)
    aot.dispatchers()  # numba types each kernel's callees from its module's globals
    digest = aot.source_digest()  # what the kernels were built from, checked when loaded
    cc.export("source_digest", "int64()")(lambda: digest)
    flags = compiler.Flags
    compiler.Flags = ReleasingGil
    try:
        cc.compile()
    finally:
        compiler.Flags = flags


setup(
    ext_modules=[Extension(MODULE, sources=[], optional=True)],
    cmdclass={"build_ext": BuildKernels},
)
