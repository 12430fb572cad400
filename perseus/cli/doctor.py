"""``perseus doctor``: can this machine run perseus for real?

Checks, for each NVIDIA GPU: the driver and NVML (versions), name, UUID, architecture, whether
clock locking works (a lock whose read-back shows the clock moved; otherwise the NVML error and
exactly how to allow it), the supported clocks, the set
latency (skipped under ``--no-clock-changes``), the energy counter's resolution and update
period, the power cap and clock event reasons, idle and blocked-on-communication power (the
``blocking_power_w`` a plan needs: the energy counter read while a spin-wait kernel holds the
GPU, as NCCL's waits do; observe-only), and a short CUDA check: a transformer block's
forward and backward through the real agent path at a few clocks (under
``--no-clock-changes``: only at the current clock), with the SM clock read back while the ops
run and the ops timed by CUDA events (it fails when the clock read is not the one asked, with
no power or thermal reason set, and says whether the power cap binds at the top clock). Without
a GPU it says so in one line and checks the simulated path instead.

Every probe is isolated: one that cannot run prints ``unavailable: why`` and the others go on.
Exit status: 0 when perseus can run for real here (observe-only counts when asked for with
``--no-clock-changes``), 1 when not, 2 on bad flags. ``--json`` prints the same as one JSON
document.

``--no-clock-changes`` never calls an NVML set or reset function: the GPUs are opened with
``NvmlGPU(control=False)``.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import sys
from dataclasses import dataclass
from importlib import metadata
from typing import TYPE_CHECKING, Any

from perseus.cli._args import float_arg, int_arg

if TYPE_CHECKING:  # heavy modules load when the command runs, not for --help
    from perseus.cli._doctor_checks import Check
    from perseus.device.nvml import NvmlGPU

__all__ = ["diagnose", "register", "run"]

_MARK = {"ok": "ok", "warn": "warn", "fail": "FAIL", "skip": "skip", "unavailable": "n/a"}
# Statuses that make a GPU unusable for real runs.
_BLOCKING = {"fail"}


def register(sub: argparse._SubParsersAction[Any]) -> None:
    p = sub.add_parser(
        "doctor",
        help="check whether this machine can run perseus for real (GPU, driver, privileges)",
        description=__doc__.split("\n\n")[0] if __doc__ else None,
    )
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
    p.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    from perseus.device import nvml as nvml_backend

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
    if args.json:
        print(json.dumps(report, indent=1))
    else:
        _print(report)
    return 0 if report["usable"] else 1


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
    missing or failing GPU: that is what the report is for."""
    from perseus.device import nvml as nvml_backend
    from perseus.device.nvml import call_nvml

    report: dict[str, Any] = {
        "perseus": _version("perseus-energy"),
        "mode": "observe-only" if no_clock_changes else "control",
        "nvml": None,
        "gpus": [],
        "simulated": None,
    }
    try:
        nvml = nvml_module if nvml_module is not None else nvml_backend.import_nvml()
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


@dataclass(frozen=True, slots=True)
class _Options:
    """The flags every GPU's checks share."""

    no_clock_changes: bool
    clocks: int
    iterations: int
    energy_window_s: float
    power_window_s: float


def _without_gpu(report: dict[str, Any], error: Exception) -> dict[str, Any]:
    """The report where NVML is unusable: the simulated path checked instead."""
    from perseus.cli._doctor_checks import Check, first_line, probe
    from perseus.cli._doctor_cuda import check_simulated

    report["no_gpu"] = (
        f"no NVIDIA GPU usable here ({first_line(error)}); checking the simulated path"
    )
    report["simulated"] = probe("simulated path", check_simulated).as_dict()
    report["blocking_power"] = Check(
        "blocking power",
        "skip",
        "needs an NVIDIA GPU (it reads idle and blocked-on-communication power from the "
        f"GPU's energy counter); known without measuring: {_known_blocking_power()}",
    ).as_dict()
    report["usable"] = False
    report["verdict"] = (
        "perseus cannot change real GPU clocks on this machine; planning, emulation and "
        "the simulated path " + ("work" if report["simulated"]["status"] == "ok" else "FAIL")
    )
    return report


def _gpu_count(nvml: Any, report: dict[str, Any]) -> int:
    """How many GPUs NVML sees (0 on error), noting the versions in ``report``."""
    from perseus.cli._doctor_checks import first_line
    from perseus.device.nvml import call_nvml

    try:
        report["nvml"] = _versions(nvml)
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
    if report["usable"]:
        return (
            "perseus can run here, observe-only as asked (no clock changes)"
            if no_clock_changes
            else "perseus can run here and change clocks"
        )
    bad = [f"GPU {g['index']}: {g['blocking']}" for g in report["gpus"] if not g["usable"]]
    no_locks = any(
        c["name"] == "clock locking" and c["status"] == "fail"
        for g in report["gpus"]
        for c in g["checks"]
    )
    head = "perseus cannot change clocks here" if no_locks else "perseus cannot run for real here"
    return f"{head}: " + "; ".join(bad)


def _diagnose_gpu(nvml: Any, index: int, options: _Options, *, cuda: bool) -> dict[str, Any]:
    from perseus.cli._doctor_checks import probe
    from perseus.device.nvml import NvmlGPU

    gpu = NvmlGPU(index=index, nvml_module=nvml, control=not options.no_clock_changes)
    opened = probe("open", lambda: _open(gpu))
    if opened.status != "ok":
        checks = [opened]
    else:
        try:
            checks = _gpu_checks(gpu, options, cuda)
        finally:
            with contextlib.suppress(Exception):
                gpu.close()
    blocking = [c for c in checks if c.status in _BLOCKING or c.name in ("open",)]
    if options.no_clock_changes:
        blocking = [c for c in blocking if c.name != "clock locking"]
    # A probe that could not run at all on a check perseus needs is blocking too.
    needed = {"open", "gpu", "supported clocks", "energy counter"}
    blocking += [c for c in checks if c.status == "unavailable" and c.name in needed]
    return {
        "index": index,
        "checks": [c.as_dict() for c in checks],
        "usable": not blocking,
        "blocking": "; ".join(f"{c.name}: {c.summary}" for c in blocking),
    }


def _gpu_checks(gpu: NvmlGPU, options: _Options, cuda: bool) -> list[Check]:
    """The checks of one opened GPU, in order."""
    from perseus.cli._doctor_checks import (
        Check,
        check_clock_control,
        check_clocks,
        check_energy_counter,
        check_identity,
        check_memory_clock_locking,
        check_power,
        check_set_latency,
        probe,
    )
    from perseus.cli._doctor_cuda import check_cuda
    from perseus.cli._doctor_power import check_blocking_power

    no_changes = options.no_clock_changes
    checks = [probe("gpu", lambda: check_identity(gpu))]
    checks.append(probe("supported clocks", lambda: check_clocks(gpu)))
    control = probe("clock locking", lambda: check_clock_control(gpu, no_changes))
    can_lock = control.status == "ok"
    checks.append(control)
    checks.append(probe("memory clock locking", lambda: check_memory_clock_locking(gpu, can_lock)))
    if can_lock:
        checks.append(probe("set latency", lambda: check_set_latency(gpu)))
    else:
        why = "--no-clock-changes" if no_changes else "clock locking not allowed"
        checks.append(Check("set latency", "skip", f"skipped ({why})"))
    window_s = options.energy_window_s
    checks.append(probe("energy counter", lambda: check_energy_counter(gpu, window_s)))
    checks.append(probe("power", lambda: check_power(gpu)))
    # Before the CUDA check: its transformer leaves the GPU warm for a while.
    power_s = options.power_window_s
    checks.append(probe("blocking power", lambda: check_blocking_power(gpu, power_s, cuda=cuda)))
    if cuda:
        clocks, iterations = options.clocks, options.iterations
        checks.append(
            probe(
                "cuda check",
                lambda: check_cuda(gpu, can_lock, clocks=clocks, iterations=iterations),
            )
        )
    else:
        checks.append(Check("cuda check", "skip", "skipped (--no-cuda or not first GPU)"))
    return checks


def _known_blocking_power() -> str:
    from perseus.device.presets import BLOCKING_POWER

    return ", ".join(
        f"{f.family} {f.power_w:g} W{' (estimate)' if f.estimated else ''}"
        for _, f in BLOCKING_POWER
    )


def _open(gpu: NvmlGPU) -> Check:
    from perseus.cli._doctor_checks import Check

    gpu.open()
    return Check("open", "ok", "opened")


def _versions(nvml: Any) -> dict[str, Any]:
    from perseus.cli._doctor_checks import first_line
    from perseus.device.nvml import call_nvml

    out: dict[str, Any] = {"nvidia_ml_py": _version("nvidia-ml-py")}
    for key, function in (
        ("driver", "nvmlSystemGetDriverVersion"),
        ("nvml", "nvmlSystemGetNVMLVersion"),
        ("cuda_driver", "nvmlSystemGetCudaDriverVersion_v2"),
    ):
        try:
            value = call_nvml(nvml, function)
        except Exception as e:
            out[key] = f"unavailable: {first_line(e)}"
            continue
        value = value.decode() if isinstance(value, bytes) else value
        if key == "cuda_driver" and isinstance(value, int):
            value = f"{value // 1000}.{value % 1000 // 10}"
        out[key] = str(value)
    return out


def _version(dist: str) -> str | None:
    try:
        return metadata.version(dist)
    except metadata.PackageNotFoundError:
        return None


def _line(check: dict[str, Any], indent: str = "  ") -> None:
    print(
        f"{indent}[{_MARK.get(check['status'], check['status'])}] {check['name']}: {check['summary']}"
    )
    if check.get("fix"):
        print(f"{indent}       fix: {check['fix']}")


def _print(report: dict[str, Any]) -> None:
    if report.get("no_gpu"):
        print(report["no_gpu"])
        if report["simulated"] is not None:
            _line(report["simulated"])
        if report.get("blocking_power") is not None:
            _line(report["blocking_power"])
        print(f"verdict: {report['verdict']}")
        return
    versions = report["nvml"] or {}
    if "error" in versions:
        print(f"NVML: {versions['error']}")
    else:
        print(
            f"driver {versions.get('driver')}, NVML {versions.get('nvml')}, CUDA driver "
            f"{versions.get('cuda_driver')}, nvidia-ml-py {versions.get('nvidia_ml_py')}"
        )
    if report["mode"] == "observe-only":
        print("mode: observe-only (--no-clock-changes: no NVML set/reset call is made)")
    for gpu in report["gpus"]:
        print(f"GPU {gpu['index']}:")
        for check in gpu["checks"]:
            _line(check)
    print(f"verdict: {report['verdict']}")
    sys.stdout.flush()
