"""``perseus doctor``'s blocking-power probe: idle and blocked-on-communication power, observed.

NCCL waits by spinning a kernel, so a GPU waiting on P2P stays awake with its SMs almost idle;
this probe reproduces that with a spin-wait kernel (``torch.cuda._sleep``) and reads the energy
counter meanwhile (whole publish intervals only, never the instant power field). It never sets
a clock or a power limit.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from typing import Any

from perseus.cli._doctor_checks import Check, poll_counter
from perseus.cli._doctor_cuda import cuda_device_for
from perseus.device.clock import REAL_CLOCK, Clock
from perseus.device.nvml import NvmlGPU
from perseus.device.presets import blocking_power_of_name
from perseus.errors import DeviceError

__all__ = ["check_blocking_power", "measure_power_w", "spin_wait"]

#: Poll period of the energy counter (NVML publishes every ~100 ms; a read costs ~ms).
_POLL_S = 0.002
#: Length of one spin-wait kernel at the GPU's highest clock (longer at a lower clock).
_SPIN_CHUNK_S = 0.01
#: Spin kernels kept queued ahead of the device, so it never idles between them.
_SPIN_QUEUE = 4


def measure_power_w(
    read_energy_mj: Callable[[], int],
    window_s: float,
    *,
    settle_s: float = 0.0,
    busy: Callable[[], None] | None = None,
    clock: Clock = REAL_CLOCK,
    poll_s: float = _POLL_S,
) -> tuple[float, int]:
    """Mean power (W) between the first and the last counter publish seen in ``window_s``
    (opened after ``settle_s``: power ramps after work starts), and how many publishes were
    seen; ``busy`` is called before every poll. DeviceError if the counter changed fewer than
    twice (no whole publish interval) or went backwards."""
    start = clock.now()
    while clock.now() - start < settle_s:
        if busy is not None:
            busy()
        clock.sleep(poll_s)
    last, publishes, _reads = poll_counter(
        read_energy_mj, window_s, busy=busy, clock=clock, poll_s=poll_s
    )
    for _, value in publishes:
        if value < last:
            raise DeviceError(f"energy counter went backwards ({last} -> {value} mJ)")
        last = value
    if len(publishes) < 2:
        raise DeviceError(
            f"the energy counter changed {len(publishes)} times in {window_s:g} s; "
            "watch it longer (--power-window-s)"
        )
    (t0, e0), (t1, e1) = publishes[0], publishes[-1]
    return (e1 - e0) / 1000.0 / (t1 - t0), len(publishes)


def spin_wait(torch: Any, device: Any, max_clock_mhz: int) -> tuple[Callable[[], None], Any]:
    """A ``busy`` callback keeping ``device`` in spin-wait kernels (at most ``_SPIN_QUEUE``
    queued), and a function draining them; DeviceError if this torch has none."""
    sleep_kernel = getattr(torch.cuda, "_sleep", None)
    if sleep_kernel is None:
        raise DeviceError(f"torch {torch.__version__} has no torch.cuda._sleep spin kernel")
    cycles = int(_SPIN_CHUNK_S * max_clock_mhz * 1e6)
    queued: deque[Any] = deque()
    stream = torch.cuda.Stream(device=device)

    def busy() -> None:
        while queued and queued[0].query():
            queued.popleft()
        with torch.cuda.stream(stream):
            while len(queued) < _SPIN_QUEUE:
                sleep_kernel(cycles)
                event = torch.cuda.Event()
                event.record(stream)
                queued.append(event)

    def drain() -> None:
        stream.synchronize()
        queued.clear()

    return busy, drain


def check_blocking_power(
    gpu: NvmlGPU,
    window_s: float,
    *,
    cuda: bool = True,
    spin: Callable[[NvmlGPU], tuple[Callable[[], None], Callable[[], None]]] | None = None,
    clock: Clock = REAL_CLOCK,
) -> Check:
    """Idle power, then power while a spin-wait kernel holds the GPU, from the energy counter.

    ``spin`` starts the spin-wait kernels and returns ``(busy, drain)`` (default:
    :func:`spin_wait` on the GPU's CUDA device); ``cuda`` False measures idle power only.
    """
    name = "blocking power"
    idle_w, idle_publishes = measure_power_w(gpu.energy_mj, window_s, clock=clock)
    data: dict[str, Any] = {
        "window_s": window_s,
        "idle_w": round(idle_w, 2),
        "idle_publishes": idle_publishes,
    }
    figure = blocking_power_of_name(gpu.name)
    known = ""
    if figure is not None:
        data.update(table_w=figure.power_w, table_estimated=figure.estimated)
        known = f"; table: {figure.power_w:g} W ({'estimate' if figure.estimated else 'measured'})"
    if not cuda:
        summary = (
            f"idle {idle_w:.1f} W; blocked power skipped (it runs a spin-wait kernel with "
            f"the CUDA check: --no-cuda, or not the first GPU){known}"
        )
        return Check(name, "skip", summary, data)
    try:
        busy, drain = (spin or _torch_spin)(gpu)
    except (ImportError, DeviceError) as e:
        summary = f"idle {idle_w:.1f} W; blocked power unavailable ({e}){known}"
        fix = "install a CUDA build of torch to measure blocked power"
        return Check(name, "unavailable", summary, data, fix)
    try:
        blocked_w, publishes = measure_power_w(
            gpu.energy_mj, window_s, settle_s=0.5, busy=busy, clock=clock
        )
    finally:
        drain()
    data.update(blocked_w=round(blocked_w, 2), blocked_publishes=publishes)
    summary = (
        f"idle {idle_w:.1f} W, blocked in a spin-wait kernel {blocked_w:.1f} W"
        f"{known}; plan with blocking_power_w={blocked_w:.1f}"
    )
    status = "ok"
    if figure is not None and abs(blocked_w - figure.power_w) > 0.2 * figure.power_w:
        status = "warn"
        summary += " (more than 20 % off the table: pass the measured value)"
    return Check(name, status, summary, data)


def _torch_spin(gpu: NvmlGPU) -> tuple[Callable[[], None], Callable[[], None]]:
    import torch

    if not torch.cuda.is_available():
        raise DeviceError(f"torch {torch.__version__} sees no CUDA device for the spin kernel")
    device = torch.device("cuda", cuda_device_for(torch, gpu))
    return spin_wait(torch, device, max(gpu.supported_clocks_mhz()))
