"""The solver's kernels compiled ahead of time, at install, so that no run waits for numba.

``pip install`` compiles the kernels named in :data:`KERNELS` into one extension module,
``perseus.solver._kernels`` (numba's ``pycc``; ``setup.py``), each for the argument types the
solver passes: C-contiguous int64/float64 arrays and float, int and bool scalars. Each public
kernel name (``plan_kernels.forward_pass``, ``compiled.walk_kernel``...) is then
:func:`ahead_of_time`'s wrapper: it calls the native function when every argument has the type
it was compiled for (its wrapper does not check: a wrong one would crash it) and numba's
dispatcher otherwise; attributes (``signatures``, ``py_func``...) are the dispatcher's. Where
the module was not built (no C compiler at install), or was built from other source than the
modules in :data:`SOURCES` hold now (an editable install changed since: one log line), the names
are the dispatchers themselves and numba compiles on first use. Both run the same Python
source, so they give the same floats (no fast-math either way). The kernels are declared with
:data:`jit` and its variants, which make numba's dispatchers only when one is first needed
(:func:`dispatchers`): with the built module, a solve never imports numba.
"""

from __future__ import annotations

import functools
import hashlib
import importlib
import importlib.util
import logging
import sys
import threading
from collections.abc import Callable
from types import ModuleType
from typing import Any

import numpy as np

__all__ = [
    "KERNELS",
    "MODULE",
    "SOURCES",
    "ahead_of_time",
    "dispatchers",
    "jit",
    "jit_inline",
    "jit_noalloc",
    "native_module",
    "numba_types",
    "source_digest",
]

#: The extension module ``setup.py`` builds.
MODULE = "perseus.solver._kernels"
#: The modules the kernels are built from: a change to any of them needs a new build.
SOURCES = ("aot", "cut_network", "cut_capacities", "plan_kernels", "compiled")

# Argument types: (dtype, ndim) for a C-contiguous writable array, a name for a scalar, a
# tuple of them for a tuple (of arrays, scalars or both).
_I1, _F1, _I2, _F2, _B1 = ("int64", 1), ("float64", 1), ("int64", 2), ("float64", 2), ("bool", 1)
_F, _I, _B = "float64", "int64", "boolean"
_TOPO = (_I1, _I1, _I1, _F1, _I1, _I1, _F1)  # order, preds (ptr, idx, lat), succs (same)
_COSTS = (_I1, _F2)  # node type, per-type option table
ArgType = Any  # a (dtype, ndim) pair, a scalar name, or a tuple of ArgTypes

#: Per kernel: its module and its arguments' types (those the solver passes).
KERNELS: dict[str, tuple[str, tuple[ArgType, ...]]] = {
    "forward_pass": ("plan_kernels", (*_TOPO[:4], _F1, _F1, _F1)),
    "backward_pass": ("plan_kernels", (_I1, *_TOPO[4:], _F1, _F, _F1, _F1)),
    "evaluate_kernel": ("plan_kernels", (_TOPO[:4], _I1, _F2, _F2, _F, _I2)),
    "reclaim_kernel": ("plan_kernels", (_TOPO, *_COSTS, _I2)),
    "tighten_kernel": ("plan_kernels", (_TOPO, *_COSTS, _I2, _F1)),
    "neighbour_kernel": ("plan_kernels", (_TOPO, _I1, _F2, _F2, _I1, _F, _I2, _F1, _F1, _B)),
    "walk_kernel": (
        "compiled",
        (
            _TOPO,
            (_F2, _F2, _F2, _I1),  # hull: vertex times, slopes, costs, vertex counts
            *_COSTS,
            *(_F1, _F1),  # durations, state
            (_F, _F, _F, _B, _F, _I, _I, _F),  # tol ... anchor_s
            (_I1, _I1, _I1, _I1, _I1, _B1, _I1, _I1),  # the cut network
        ),
    ),
}

_SCALARS: dict[str, tuple[type, ...]] = {
    "float64": (float, np.float64),
    "int64": (int, np.int64),
    "boolean": (bool, np.bool_),
}


@functools.cache
def native_module() -> ModuleType | None:
    """The kernels compiled at install, or None where they were not built or were built from
    other source (an editable install changed since: said once, and numba compiles them)."""
    try:
        module = importlib.import_module(MODULE)
    except ImportError:
        return None
    built_from = getattr(module, "source_digest", None)
    if built_from is None or built_from() != source_digest():
        logging.getLogger(__name__).warning(
            "the solver kernels built at install come from other source than this (changed "
            "since): numba compiles them instead; `pip install -e .` builds them again"
        )
        return None
    return module


def source_digest() -> int:
    """The first 60 bits of the SHA-256 of :data:`SOURCES`, as read by the import system (a
    build stores it in the module it builds, as the function ``source_digest``)."""
    digest = hashlib.sha256()
    for name in SOURCES:
        spec = importlib.util.find_spec(f"perseus.solver.{name}")
        if spec is None or spec.origin is None or spec.loader is None:
            raise ImportError(f"perseus.solver.{name}: no source to read")
        digest.update(spec.loader.get_data(spec.origin))  # type: ignore[attr-defined]
    return int(digest.hexdigest()[:15], 16)


def ahead_of_time(name: str, jitted: Any) -> Any:
    """``jitted`` (a numba dispatcher), calling ``name`` from the native module instead when
    it was built and the arguments have its types."""
    module = native_module()
    native = getattr(module, name, None) if module is not None else None
    if native is None:
        return jitted
    return _Native(native, jitted, KERNELS[name][1])


class _Native:
    """A kernel compiled ahead of time, numba's dispatcher where the arguments differ."""

    def __init__(self, native: Callable[..., Any], jitted: Any, types: tuple[ArgType, ...]):
        self._native, self._jitted, self._types = native, jitted, types

    def __call__(self, *args: Any) -> Any:
        if len(args) == len(self._types) and all(map(_matches, args, self._types)):
            return self._native(*args)
        return self._jitted(*args)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._jitted, name)


class _Lazy:
    """``numba.njit(**options)(py_func)``, made when first called or looked into
    (:func:`dispatchers`): importing the solver imports numba only where the kernels were not
    built at install."""

    def __init__(self, py_func: Callable[..., Any], options: dict[str, Any]) -> None:
        self.py_func, self._options = py_func, options
        self._dispatcher: Any = None
        self.__name__, self.__doc__ = py_func.__name__, py_func.__doc__

    def __call__(self, *args: Any) -> Any:
        return self.dispatcher()(*args)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.dispatcher(), name)

    def dispatcher(self) -> Any:
        if self._dispatcher is None:
            dispatchers()
        return self._dispatcher


_LAZY: list[_Lazy] = []
_MADE = threading.Lock()


def _jit(**options: Any) -> Callable[[Callable[..., Any]], Any]:
    def decorate(py_func: Callable[..., Any]) -> Any:
        kernel = _Lazy(py_func, options)
        _LAZY.append(kernel)
        return kernel

    return decorate


#: numba's compiler, with the on-disk cache.
jit = _jit(cache=True, nogil=True)
#: The same, inlined at each call site (numba IR inlining): augment's and the walk's steps, one
#: compiled function each, not several.
jit_inline = _jit(cache=True, nogil=True, inline="always")
#: The same without numba's reference counting (its NRT), for the walk's inner-loop functions:
#: the atomic increment and decrement of every array passed or unpacked from a tuple took a
#: quarter of a walk's time (``perf`` on a 32x40 walk: 6.7 -> 5.2 s, the same cuts). They
#: cannot allocate (numba refuses to compile an allocation without it).
jit_noalloc = _jit(cache=True, nogil=True, _nrt=False)


def dispatchers() -> None:
    """numba's dispatcher for every kernel, put in place of its stand-in wherever one of
    :data:`SOURCES` names it (numba finds a kernel's callees in its module's globals)."""
    import numba

    with _MADE:
        for kernel in _LAZY:
            if kernel._dispatcher is None:
                kernel._dispatcher = numba.njit(**kernel._options)(kernel.py_func)
        for name in SOURCES:  # those not imported yet will import the dispatchers
            module = sys.modules.get(f"perseus.solver.{name}")
            for key, value in list(vars(module).items()) if module is not None else []:
                if isinstance(value, _Lazy):
                    setattr(module, key, value._dispatcher)


def _is_array(kind: ArgType) -> bool:
    return len(kind) == 2 and isinstance(kind[0], str) and isinstance(kind[1], int)


def _matches(value: Any, kind: ArgType) -> bool:
    if isinstance(kind, str):
        return type(value) in _SCALARS[kind]
    if _is_array(kind):
        return (
            type(value) is np.ndarray
            and value.dtype == kind[0]
            and value.ndim == kind[1]
            and value.flags.c_contiguous
            and value.flags.writeable
            and value.flags.aligned
        )
    return type(value) is tuple and len(value) == len(kind) and all(map(_matches, value, kind))


def numba_types(kinds: tuple[ArgType, ...]) -> tuple[Any, ...]:
    """The numba types of ``kinds`` (for the build)."""
    from numba import from_dtype, types

    def one(kind: ArgType) -> Any:
        if isinstance(kind, str):
            return getattr(types, kind)
        if _is_array(kind):
            return types.Array(from_dtype(np.dtype(kind[0])), kind[1], "C")
        return types.Tuple([one(k) for k in kind])  # type: ignore[no-untyped-call]

    return tuple(one(k) for k in kinds)
