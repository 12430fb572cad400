"""Read-only probe of a lent GPU: NVML facts, energy-counter granularity, clock read-back during
transformer ops, host run-ahead. Never sets or resets any clock, power limit or mode."""

import contextlib
import itertools
import json
import os
import statistics
import sys
import threading
import time

import pynvml as N

out_dir = os.environ.get("OUT", "/tmp")
res: dict = {}


def q(name, fn, *a):
    try:
        v = fn(*a)
        if isinstance(v, bytes):
            v = v.decode()
        res[name] = v
        return v
    except Exception as e:
        res[name] = f"unavailable: {type(e).__name__}: {e}"
        return None


N.nvmlInit()
q("driver", N.nvmlSystemGetDriverVersion)
q("nvml_version", N.nvmlSystemGetNVMLVersion)
q("cuda_driver_version", N.nvmlSystemGetCudaDriverVersion)
h = N.nvmlDeviceGetHandleByIndex(0)
q("name", N.nvmlDeviceGetName, h)
q("uuid", N.nvmlDeviceGetUUID, h)
q("arch", N.nvmlDeviceGetArchitecture, h)
q("persistence", N.nvmlDeviceGetPersistenceMode, h)
mem = q("mem_clocks", N.nvmlDeviceGetSupportedMemoryClocks, h)
if mem:
    g = q("gr_clocks_at_max_mem", N.nvmlDeviceGetSupportedGraphicsClocks, h, max(mem))
    if g:
        gs = sorted(g)
        res["gr_clock_summary"] = {
            "count": len(gs),
            "min": gs[0],
            "max": gs[-1],
            "steps": sorted({b - a for a, b in itertools.pairwise(gs)}),
        }
        res.pop("gr_clocks_at_max_mem")
q("default_app_sm", N.nvmlDeviceGetDefaultApplicationsClock, h, N.NVML_CLOCK_SM)
q("app_sm", N.nvmlDeviceGetApplicationsClock, h, N.NVML_CLOCK_SM)
q("max_sm", N.nvmlDeviceGetMaxClockInfo, h, N.NVML_CLOCK_SM)
q("sm_now", N.nvmlDeviceGetClockInfo, h, N.NVML_CLOCK_SM)
q("mem_now", N.nvmlDeviceGetClockInfo, h, N.NVML_CLOCK_MEM)
q("power_limit_mw", N.nvmlDeviceGetPowerManagementLimit, h)
q("power_limit_default_mw", N.nvmlDeviceGetPowerManagementDefaultLimit, h)
q("power_limit_constraints_mw", N.nvmlDeviceGetPowerManagementLimitConstraints, h)
q("enforced_power_limit_mw", N.nvmlDeviceGetEnforcedPowerLimit, h)
q("power_now_mw", N.nvmlDeviceGetPowerUsage, h)
q(
    "api_restricted_app_clocks",
    N.nvmlDeviceGetAPIRestriction,
    h,
    N.NVML_RESTRICTED_API_SET_APPLICATION_CLOCKS,
)
fn_reasons = (
    getattr(N, "nvmlDeviceGetCurrentClocksEventReasons", None)
    or N.nvmlDeviceGetCurrentClocksThrottleReasons
)
q("clock_event_reasons_idle", fn_reasons, h)
res["euid"] = os.geteuid()
try:
    with open("/proc/self/status") as f:
        cap = next(line for line in f if line.startswith("CapEff")).split()[1]
    res["cap_sys_admin"] = bool(int(cap, 16) >> 21 & 1)
except Exception as e:
    res["cap_sys_admin"] = f"unavailable: {e}"


def instant_power_mw():
    try:
        fv = N.nvmlDeviceGetFieldValues(h, [N.NVML_FI_DEV_POWER_INSTANT])[0]
        return fv.value.uiVal if fv.nvmlReturn == 0 else None
    except Exception:
        return None


res["instant_power_idle_mw"] = instant_power_mw()


def counter_poll(duration_s):
    """Poll the energy counter every ~0.5 ms; intervals between changes and step sizes."""
    t_end = time.perf_counter() + duration_s
    last = N.nvmlDeviceGetTotalEnergyConsumption(h)
    last_t = time.perf_counter()
    changes = []
    calls = 0
    call_s = []
    while time.perf_counter() < t_end:
        t0 = time.perf_counter()
        e = N.nvmlDeviceGetTotalEnergyConsumption(h)
        call_s.append(time.perf_counter() - t0)
        calls += 1
        if e != last:
            now = time.perf_counter()
            changes.append((now - last_t, e - last))
            last, last_t = e, now
        time.sleep(0.0005)
    iv = [c[0] for c in changes[1:]]
    st = [c[1] for c in changes[1:]]
    return {
        "polls": calls,
        "changes": len(changes),
        "median_interval_ms": statistics.median(iv) * 1e3 if iv else None,
        "p10_interval_ms": sorted(iv)[len(iv) // 10] * 1e3 if iv else None,
        "p90_interval_ms": sorted(iv)[9 * len(iv) // 10] * 1e3 if iv else None,
        "median_step_mj": statistics.median(st) if st else None,
        "min_step_mj": min(st) if st else None,
        "median_call_us": statistics.median(call_s) * 1e6,
    }


res["counter_idle"] = counter_poll(2.0)

import torch  # noqa: E402

res["torch"] = torch.__version__
dev = torch.device("cuda", 0)
torch.backends.cuda.matmul.allow_tf32 = True
layer = torch.nn.TransformerEncoderLayer(
    d_model=4096,
    nhead=32,
    dim_feedforward=16384,
    batch_first=True,
    dtype=torch.bfloat16,
    device=dev,
)
x = torch.randn(4, 2048, 4096, dtype=torch.bfloat16, device=dev, requires_grad=True)


def fwd_bwd():
    y = layer(x)
    y.float().pow(2).mean().backward()


for _ in range(5):
    fwd_bwd()
torch.cuda.synchronize()

# Host run-ahead: host time to enqueue vs device time of the same work.
reps = 20
e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
t0 = time.perf_counter()
e0.record()
for _ in range(reps):
    fwd_bwd()
e1.record()
host_enqueue_s = time.perf_counter() - t0
torch.cuda.synchronize()
device_s = e0.elapsed_time(e1) / 1e3
res["run_ahead"] = {
    "reps": reps,
    "host_enqueue_ms_per_op": host_enqueue_s / reps * 1e3,
    "device_ms_per_op": device_s / reps * 1e3,
}

# Per-op device times (forward and backward separately) with events.
fw, bw = [], []
for _ in range(30):
    a, b, c = (torch.cuda.Event(enable_timing=True) for _ in range(3))
    a.record()
    y = layer(x)
    loss = y.float().pow(2).mean()
    b.record()
    loss.backward()
    c.record()
    c.synchronize()
    fw.append(a.elapsed_time(b))
    bw.append(b.elapsed_time(c))
res["op_ms"] = {
    "forward_median": statistics.median(fw),
    "backward_median": statistics.median(bw),
    "forward_spread_pct": (max(fw) - min(fw)) / statistics.median(fw) * 100,
    "backward_spread_pct": (max(bw) - min(bw)) / statistics.median(bw) * 100,
}

# Clock read-back and energy over a >= 5 s busy window.
samples = []
stop = threading.Event()


def sampler():
    while not stop.is_set():
        with contextlib.suppress(Exception):
            samples.append(
                (
                    time.perf_counter(),
                    N.nvmlDeviceGetClockInfo(h, N.NVML_CLOCK_SM),
                    instant_power_mw(),
                    fn_reasons(h),
                )
            )
        time.sleep(0.002)


th = threading.Thread(target=sampler, daemon=True)
th.start()
busy_counter = {}


def busy_poll():
    busy_counter.update(counter_poll(4.0))


tp = threading.Thread(target=busy_poll)
torch.cuda.synchronize()
E0 = N.nvmlDeviceGetTotalEnergyConsumption(h)
s0 = torch.cuda.Event(enable_timing=True)
s1 = torch.cuda.Event(enable_timing=True)
s0.record()
t_start = time.perf_counter()
tp.start()
n_ops = 0
while time.perf_counter() - t_start < 6.0:
    fwd_bwd()
    n_ops += 1
    if n_ops % 10 == 0:
        torch.cuda.synchronize()
s1.record()
torch.cuda.synchronize()
E1 = N.nvmlDeviceGetTotalEnergyConsumption(h)
stop.set()
tp.join()
th.join()
win_s = s0.elapsed_time(s1) / 1e3
res["busy_window"] = {
    "seconds": win_s,
    "fwd_bwd_pairs": n_ops,
    "energy_j": (E1 - E0) / 1e3,
    "avg_power_w": (E1 - E0) / 1e3 / win_s,
    "energy_per_fwd_bwd_j": (E1 - E0) / 1e3 / n_ops,
    "device_ms_per_fwd_bwd": win_s / n_ops * 1e3,
}
res["counter_busy"] = busy_counter
clk = [s[1] for s in samples[len(samples) // 5 :]]
pw = [s[2] for s in samples[len(samples) // 5 :] if s[2]]
rs = [s[3] for s in samples[len(samples) // 5 :]]
res["readback_busy"] = {
    "samples": len(clk),
    "sm_clock_mhz_median": statistics.median(clk) if clk else None,
    "sm_clock_mhz_min": min(clk) if clk else None,
    "sm_clock_mhz_max": max(clk) if clk else None,
    "instant_power_w_median": statistics.median(pw) / 1e3 if pw else None,
    "reasons_seen": sorted({hex(r) for r in rs}),
}
q("clock_event_reasons_after", fn_reasons, h)
time.sleep(1.0)
q("sm_after_idle_1s", N.nvmlDeviceGetClockInfo, h, N.NVML_CLOCK_SM)
N.nvmlShutdown()
with open(os.path.join(out_dir, "probe.json"), "w") as f:
    json.dump(res, f, indent=1, default=str)
print(json.dumps(res, indent=1, default=str))
sys.exit(0)
