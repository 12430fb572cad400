"""The kernels compiled at install (perseus.solver.aot): called only for the argument types they
were built for, and giving numba's JIT results bit for bit."""

from __future__ import annotations

import importlib
import shutil
import sys
import sysconfig
import types
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from perseus.solver import aot, compiled, plan_kernels, trace
from tests.solver.conftest import small_job

I1, F1, F2 = ("int64", 1), ("float64", 1), ("float64", 2)


def _dispatch(types: tuple[Any, ...], *args: Any) -> str:
    native = aot._Native(lambda *a: "native", lambda *a: "jitted", types)
    return str(native(*args))


def test_the_native_kernel_is_called_only_for_the_types_it_was_built_for() -> None:
    # Its wrapper does not check (a wrong dtype crashes it): anything else goes to numba.
    a, f, m = np.zeros(3, np.int64), np.zeros(3), np.zeros((2, 3))
    types = (I1, F1, "float64", (I1, F2), "boolean")
    assert _dispatch(types, a, f, 1.0, (a, m), True) == "native"
    assert _dispatch(types, a, f, np.float64(1.0), (a, m), np.bool_(False)) == "native"
    readonly = np.zeros(3)
    readonly.flags.writeable = False
    for wrong in (
        (a.astype(np.int32), f, 1.0, (a, m), True),  # dtype
        (a, np.zeros(6)[::2], 1.0, (a, m), True),  # not contiguous
        (a, readonly, 1.0, (a, m), True),  # read-only
        (a, f, 1, (a, m), True),  # an int for a float
        (a, f, 1.0, (a, m.T), True),  # Fortran order
        (a, f, 1.0, (a,), True),  # a shorter tuple
        (a, f, 1.0, [a, m], True),  # a list for a tuple
        (a, f, 1.0, (a, m)),  # an argument short
    ):
        assert _dispatch(types, *wrong) == "jitted"


def test_a_tuple_of_scalars_is_not_taken_for_an_array() -> None:
    # ("float64", "int64") names two scalars; ("float64", 1) a one-dimensional array.
    limits = ("float64", "int64")
    assert _dispatch((limits,), (1.0, 2)) == "native"
    assert _dispatch((limits,), (1.0, 2.0)) == "jitted"
    assert _dispatch((limits,), np.zeros(2)) == "jitted"
    assert _dispatch((F1,), np.zeros(2)) == "native"


def test_without_the_built_module_the_names_are_numbas_dispatchers(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(aot, "native_module", lambda: None)
    jitted = object()
    assert aot.ahead_of_time("walk_kernel", jitted) is jitted


def test_kernels_built_from_other_source_are_not_used(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    # An editable install whose kernel modules changed since the build: numba compiles them.
    built = types.ModuleType(aot.MODULE)
    monkeypatch.setitem(sys.modules, aot.MODULE, built)
    aot.native_module.cache_clear()
    try:
        built.source_digest = aot.source_digest  # type: ignore[attr-defined]
        assert aot.native_module() is built
        for digest in (lambda: aot.source_digest() + 1, None):  # other source; no digest
            aot.native_module.cache_clear()
            if digest is None:
                del built.source_digest  # type: ignore[attr-defined]
            else:
                built.source_digest = digest  # type: ignore[attr-defined]
            caplog.clear()
            assert aot.native_module() is None
            assert "other source than this" in caplog.text
    finally:
        aot.native_module.cache_clear()


def test_the_kernels_are_built_at_install_where_a_c_compiler_is_found() -> None:
    # The build is optional for users, but where it can run (as in CI) it must have: else
    # every other test here would pass on numba's JIT alone.
    headers = Path(sysconfig.get_paths()["include"], "Python.h")
    if shutil.which("cc") is None or not headers.is_file():
        pytest.skip("no C compiler or Python headers here: the build is skipped by design")
    try:
        built = importlib.import_module(aot.MODULE)
    except ImportError:
        pytest.fail("perseus.solver._kernels was not built (`pip install -v -e .` says why)")
    if built.source_digest() != aot.source_digest():
        pytest.skip("built from older source: `pip install -e .` builds it again")
    assert aot.native_module() is built
    assert all(isinstance(kernel, aot._Native) for kernel in _kernels().values())


def _kernels() -> dict[str, Any]:
    names = [name for name, (module, _) in aot.KERNELS.items() if module == "plan_kernels"]
    return {name: getattr(plan_kernels, name) for name in names} | {
        "walk_kernel": compiled.walk_kernel
    }


@pytest.mark.slow
def test_each_native_kernel_gives_the_jitted_results_bit_for_bit(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    kernels = _kernels()
    if not all(isinstance(k, aot._Native) for k in kernels.values()):
        pytest.skip("no kernels built at install from this source (perseus.solver._kernels)")
    # Record the first call of each kernel in a solve (every one is called), with its inputs.
    calls: dict[str, tuple[Any, ...]] = {}
    for name, kernel in kernels.items():

        def record(*args: Any, name: str = name, kernel: Any = kernel) -> Any:
            calls.setdefault(name, _copy(args))
            return kernel(*args)

        module = compiled if name == "walk_kernel" else plan_kernels
        monkeypatch.setattr(module, name, record)
    trace(small_job("1f1b", 3, 6, seed=4))
    monkeypatch.undo()
    assert set(calls) == set(kernels)
    for name, args in calls.items():
        kernel = kernels[name]
        native_args, jitted_args = _copy(args), _copy(args)
        native = kernel._native(*native_args)
        jitted = kernel._jitted(*jitted_args)
        _assert_identical(native, jitted, name)
        _assert_identical(native_args, jitted_args, name)  # what they write in place


def _copy(value: Any) -> Any:
    if isinstance(value, np.ndarray):
        return value.copy()
    if isinstance(value, tuple):
        return tuple(_copy(v) for v in value)
    return value


def _assert_identical(a: Any, b: Any, name: str) -> None:
    if isinstance(a, tuple):
        assert isinstance(b, tuple) and len(a) == len(b), name
        for x, y in zip(a, b, strict=True):
            _assert_identical(x, y, name)
    elif isinstance(a, np.ndarray):
        assert a.dtype == b.dtype and a.shape == b.shape, name
        assert a.tobytes() == b.tobytes(), name  # bit for bit, NaNs included
    else:
        assert a == b or (a != a and b != b), name
