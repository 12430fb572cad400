"""``perseus doctor``: can this machine run perseus for real?

Checks each NVIDIA GPU (docs/devices.md lists the checks), or, without one, the simulated path;
a probe that cannot run says ``unavailable: why`` and the others go on. Exit 0 when perseus can
run for real here (observe-only counts when asked for), 1 when not, 2 on bad flags.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import signal
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from importlib import metadata
from types import FrameType
from typing import TYPE_CHECKING, Any

from perseus.cli._args import first_line, float_arg, int_arg

if TYPE_CHECKING:  # heavy modules load when the command runs, not for --help
    from perseus.cli._doctor_checks import Check
    from perseus.device.nvml import NvmlGPU

__all__ = ["diagnose", "register", "run"]

_MARK = {"ok": "ok", "warn": "warn", "fail": "FAIL", "skip": "skip", "unavailable": "n/a"}
#: Checks perseus needs: one whose probe could not run makes the GPU unusable.
_NEEDED = {"open", "gpu", "supported clocks", "energy counter"}


def register(sub: argparse._SubParsersAction[Any]) -> None:
    p = sub.add_parser(
        "doctor",
        help="check whether this machine can run perseus for real (GPU, driver, privileges)",
        description=__doc__.split("\n\n")[0] if __doc__ else None,
    )
    p.set_defaults(handler=run)
    p.add_argument("--json", action="store_true", help="print one JSON document")
    p.add_argument(
        "--no-clock-changes",
        action="store_true",
        help="never change clocks or power limits (observe-only; no NVML set/reset call)",
    )
    p.add_argument(
        "--gpu",
        type=int_arg(ge=0, le=1023),
        action="append",
        metavar="INDEX",
        help="only these GPUs (NVML indices)",
    )
    p.add_argument("--no-cuda", action="store_true", help="skip the CUDA check")
    for flag, kind, default, text in (
        ("--clocks", int_arg(ge=1, le=64), 3, "clocks for the CUDA check (default 3, at most 64)"),
        (
            "--iterations",
            int_arg(ge=1, le=1000),
            5,
            "CUDA check iterations per clock (default 5, at most 1000)",
        ),
        (
            "--energy-window-s",
            float_arg(gt=0, le=60, unit="s"),
            1.0,
            "how long to poll the energy counter (default 1 s, at most 60)",
        ),
        (
            "--power-window-s",
            float_arg(gt=0, le=600, unit="s"),
            3.0,
            "how long to read idle and blocked power each (default 3 s)",
        ),
    ):
        p.add_argument(flag, type=kind, default=default, help=text)


def run(args: argparse.Namespace) -> int:
    from perseus.device import nvml as nvml_backend

    with _resets_before_signal_ends():
        report = diagnose(
            # The environment's request (PERSEUS_NO_CLOCK_CHANGES=1) holds even without the flag.
            no_clock_changes=args.no_clock_changes or nvml_backend.no_clock_changes_requested(),
            gpus=args.gpu,
            cuda=not args.no_cuda,
            clocks=args.clocks,
            iterations=args.iterations,
            energy_window_s=args.energy_window_s,
            power_window_s=args.power_window_s,
        )
    print(json.dumps(report, indent=1) if args.json else _text(report), flush=True)
    return 0 if report["usable"] else 1


class _Ended(BaseException):
    """A SIGTERM/SIGHUP that ends ``perseus doctor``, raised where the checks are (a
    BaseException: a probe's ``except Exception`` must not take it for a failed check)."""

    def __init__(self, signum: int) -> None:
        super().__init__(signum)
        self.signum = signum


@contextlib.contextmanager
def _resets_before_signal_ends() -> Iterator[None]:
    """Within the block, a SIGTERM or SIGHUP that would end the process is raised as
    :class:`_Ended`, so each check's reset runs (the lock checks have no agent or watchdog to
    undo a lock), then the process ends by that signal; a second signal cannot cut a reset
    short."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    ended: list[int] = []
    armed = [True]  # off once the block is left: a signal then is only recorded

    def on_signal(signum: int, frame: FrameType | None) -> None:
        if not ended:
            ended.append(signum)
            if armed[0]:
                raise _Ended(signum)

    previous = {
        sig: signal.signal(sig, on_signal)
        for sig in (signal.SIGTERM, getattr(signal, "SIGHUP", None))
        if sig is not None and signal.getsignal(sig) == signal.SIG_DFL
    }
    try:
        yield
    except _Ended:
        pass
    finally:
        armed[0] = False
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    if ended:
        os.kill(os.getpid(), ended[0])  # the default action, restored above: the process ends
        raise SystemExit(128 + ended[0])  # pragma: no cover - reached only if it did not


@dataclass(frozen=True, slots=True)
class _Options:
    """The flags every GPU's checks share."""

    no_clock_changes: bool
    clocks: int
    iterations: int
    energy_window_s: float
    power_window_s: float


def diagnose(
    *,
    no_clock_changes: bool = False,
    gpus: list[int] | None = None,
    cuda: bool = True,
    clocks: int = 3,
    iterations: int = 5,
    energy_window_s: float = 1.0,
    power_window_s: float = 3.0,
    nvml_module: Any = None,
) -> dict[str, Any]:
    """Run every check; returns the report (what ``--json`` prints). Never raises for a
    missing or failing GPU."""
    from perseus.device.nvml import call_nvml, import_nvml

    report: dict[str, Any] = {
        "perseus": _version("perseus-energy"),
        "solver_kernels": _solver_kernels(),
        "mode": "observe-only" if no_clock_changes else "control",
        "nvml": None,
        "gpus": [],
        "simulated": None,
    }
    try:
        nvml = nvml_module if nvml_module is not None else import_nvml()
        call_nvml(nvml, "nvmlInit")
    except Exception as e:
        return _without_gpu(report, e)
    indices = [i for i in range(_gpu_count(nvml, report)) if gpus is None or i in gpus]
    options = _Options(no_clock_changes, clocks, iterations, energy_window_s, power_window_s)
    for n, i in enumerate(indices):
        # One CUDA check (on the first GPU) is enough to prove the path; it takes seconds.
        report["gpus"].append(_diagnose_gpu(nvml, i, options, cuda=cuda and n == 0))
    report["usable"] = bool(indices) and all(g["usable"] for g in report["gpus"])
    report["verdict"] = _verdict(report, indices, gpus, no_clock_changes)
    return report


def _without_gpu(report: dict[str, Any], error: Exception) -> dict[str, Any]:
    """The report where NVML is unusable: the simulated path checked instead."""
    from perseus.cli._doctor_checks import Check, probe
    from perseus.cli._doctor_cuda import check_simulated
    from perseus.device.presets import BLOCKING_POWER

    known = ", ".join(
        f"{f.family} {f.power_w:g} W{' (estimate)' if f.estimated else ''}"
        for _, f in BLOCKING_POWER
    )
    report["no_gpu"] = (
        f"no NVIDIA GPU usable here ({first_line(error)}); checking the simulated path"
    )
    report["simulated"] = probe("simulated path", check_simulated).as_dict()
    report["blocking_power"] = Check(
        "blocking power",
        "skip",
        "needs an NVIDIA GPU (it reads idle and blocked-on-communication power from the "
        f"GPU's energy counter); known without measuring: {known}",
    ).as_dict()
    report["usable"] = False
    report["verdict"] = (
        "perseus cannot change real GPU clocks on this machine; planning, emulation and "
        "the simulated path " + ("work" if report["simulated"]["status"] == "ok" else "FAIL")
    )
    return report


def _solver_kernels() -> dict[str, Any]:
    """Whether the solver's kernels were built at install from this source
    (:mod:`perseus.solver.aot`), or numba compiles them on first use."""
    from perseus.cli._doctor_checks import Check
    from perseus.solver.aot import MODULE, native_module

    if native_module() is not None:
        return Check("solver kernels", "ok", f"built at install ({MODULE})").as_dict()
    return Check(
        "solver kernels",
        "warn",
        "not built at install from this source: numba compiles them on first use (seconds to "
        "a minute, once; then cached on disk)",
        fix="install again (`pip install -e .` or `pip install .`) where a C compiler and "
        "Python's headers are found",
    ).as_dict()


def _gpu_count(nvml: Any, report: dict[str, Any]) -> int:
    """How many GPUs NVML sees (0 on error), noting the versions in ``report``."""
    from perseus.device.nvml import call_nvml

    try:
        report["nvml"] = {"nvidia_ml_py": _version("nvidia-ml-py")}
        for key, function in (
            ("driver", "nvmlSystemGetDriverVersion"),
            ("nvml", "nvmlSystemGetNVMLVersion"),
            ("cuda_driver", "nvmlSystemGetCudaDriverVersion_v2"),
        ):
            try:
                value = call_nvml(nvml, function)
            except Exception as e:
                report["nvml"][key] = f"unavailable: {first_line(e)}"
                continue
            value = value.decode() if isinstance(value, bytes) else value
            if key == "cuda_driver" and isinstance(value, int):
                value = f"{value // 1000}.{value % 1000 // 10}"
            report["nvml"][key] = str(value)
        return int(call_nvml(nvml, "nvmlDeviceGetCount"))
    except Exception as e:
        report["nvml"] = {"error": first_line(e)}
        return 0
    finally:
        with contextlib.suppress(Exception):
            call_nvml(nvml, "nvmlShutdown")


def _verdict(
    report: dict[str, Any], indices: list[int], gpus: list[int] | None, no_clock_changes: bool
) -> str:
    if not indices:
        return "NVML found no GPU" + (" with those indices" if gpus else "")
    locks = [(g, c) for g in report["gpus"] for c in g["checks"] if c["name"] == "clock locking"]
    if report["usable"]:
        if no_clock_changes:
            return "perseus can run here, observe-only as asked (no clock changes)"
        owned = [
            f"GPU {g['index']}: {c['data']['owner']}" for g, c in locks if "owner" in c["data"]
        ]
        if owned:
            return (
                "perseus can run here; clock changes not tried on a GPU a running process owns ("
                + "; ".join(owned)
                + "): run doctor again once it has ended"
            )
        return "perseus can run here and change clocks"
    bad = [f"GPU {g['index']}: {g['blocking']}" for g in report["gpus"] if not g["usable"]]
    no_locks = any(c["status"] == "fail" for _, c in locks)
    head = "perseus cannot change clocks here" if no_locks else "perseus cannot run for real here"
    return f"{head}: " + "; ".join(bad)


def _diagnose_gpu(nvml: Any, index: int, options: _Options, *, cuda: bool) -> dict[str, Any]:
    from perseus.cli._doctor_checks import Check, probe
    from perseus.device.nvml import NvmlGPU

    gpu = NvmlGPU(index=index, nvml_module=nvml, control=not options.no_clock_changes)

    def opened() -> Check:
        gpu.open()
        return Check("open", "ok", "opened")

    checks = [probe("open", opened)]
    if checks[0].status == "ok":
        try:
            checks = _gpu_checks(gpu, options, cuda)
        finally:
            with contextlib.suppress(Exception):
                gpu.close()
    blocking = [
        c
        for c in checks
        if (c.status == "fail" and not (options.no_clock_changes and c.name == "clock locking"))
        or c.name == "open"
        or (c.status == "unavailable" and c.name in _NEEDED)
    ]
    return {
        "index": index,
        "checks": [c.as_dict() for c in checks],
        "usable": not blocking,
        "blocking": "; ".join(f"{c.name}: {c.summary}" for c in blocking),
    }


def _gpu_checks(gpu: NvmlGPU, options: _Options, cuda: bool) -> list[Check]:
    """The checks of one opened GPU, in order."""
    from perseus.cli import _doctor_checks as dc
    from perseus.cli._doctor_cuda import check_cuda
    from perseus.cli._doctor_power import check_blocking_power

    no_changes = options.no_clock_changes
    identity = dc.probe("gpu", lambda: dc.check_identity(gpu))  # read before any lock is tried
    clocks = dc.probe("supported clocks", lambda: dc.check_clocks(gpu))
    owner = None if no_changes else _running_owner(gpu)
    if owner is not None:
        # Its agent sets the clocks op by op: a lock and reset here would pull them (and a
        # memory clock it set once) from under the running job.
        control = dc.Check(
            "clock locking",
            "skip",
            f"not tried: {owner}; doctor does not change its clocks",
            {"owner": owner},
        )
    else:
        control = dc.probe("clock locking", lambda: dc.check_clock_control(gpu, no_changes))
    can_lock = control.status == "ok"
    why = "--no-clock-changes" if no_changes else "clock locking not allowed"
    if owner is not None:
        why = "the GPU is owned by a running process"
    return [
        identity,
        clocks,
        control,
        dc.probe(
            "memory clock locking",
            lambda: dc.check_memory_clock_locking(
                gpu, can_lock, not_tried=why if owner is not None else None
            ),
        ),
        dc.probe("set latency", lambda: dc.check_set_latency(gpu))
        if can_lock
        else dc.Check("set latency", "skip", f"skipped ({why})"),
        dc.probe("energy counter", lambda: dc.check_energy_counter(gpu, options.energy_window_s)),
        dc.probe("power", lambda: dc.check_power(gpu)),
        # Before the CUDA check: its transformer leaves the GPU warm for a while.
        dc.probe(
            "blocking power", lambda: check_blocking_power(gpu, options.power_window_s, cuda=cuda)
        ),
        dc.probe(
            "cuda check",
            lambda: check_cuda(gpu, can_lock, clocks=options.clocks, iterations=options.iterations),
        )
        if cuda
        else dc.Check("cuda check", "skip", "skipped (--no-cuda or not first GPU)"),
    ]


def _running_owner(gpu: NvmlGPU) -> str | None:
    """``"pid N owns this GPU (lock PATH)"`` when a live process, or one in another PID
    namespace, is recorded as the GPU's owner; else None. Never takes the lock."""
    from perseus.device.ownership import recorded_owner

    try:
        path = gpu.owner_lock_path()
    except Exception:  # a refused lock directory: no owner can be told from here
        return None
    found, state = recorded_owner(path)
    if found is None or state == "gone":
        return None
    return f"pid {found.pid} owns this GPU (lock {path})"


def _version(dist: str) -> str | None:
    try:
        return metadata.version(dist)
    except metadata.PackageNotFoundError:
        return None


def _line(check: dict[str, Any]) -> str:
    mark = _MARK.get(check["status"], check["status"])
    fix = f"\n         fix: {check['fix']}" if check.get("fix") else ""
    return f"  [{mark}] {check['name']}: {check['summary']}{fix}"


def _text(report: dict[str, Any]) -> str:
    if report.get("no_gpu"):
        lines = [report["no_gpu"]]
        keys = ("simulated", "blocking_power", "solver_kernels")
        lines += [_line(report[k]) for k in keys if report.get(k)]
        return "\n".join([*lines, f"verdict: {report['verdict']}"])
    v = report["nvml"] or {}
    if "error" in v:
        lines = [f"NVML: {v['error']}"]
    else:
        lines = [
            f"driver {v.get('driver')}, NVML {v.get('nvml')}, CUDA driver "
            f"{v.get('cuda_driver')}, nvidia-ml-py {v.get('nvidia_ml_py')}"
        ]
    if report["mode"] == "observe-only":
        lines.append("mode: observe-only (--no-clock-changes: no NVML set/reset call is made)")
    lines.append(_line(report["solver_kernels"]))
    for gpu in report["gpus"]:
        lines += [f"GPU {gpu['index']}:", *(_line(c) for c in gpu["checks"])]
    return "\n".join([*lines, f"verdict: {report['verdict']}"])
