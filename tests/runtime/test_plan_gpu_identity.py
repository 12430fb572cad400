"""Plans and profiles carry the GPU they describe; a session on another GPU refuses them in one
line naming both (or runs them, warned, with the opt-in)."""

from __future__ import annotations

import logging
import re
from pathlib import Path

import pytest

from perseus.device.simulated import SimulatedGPU
from perseus.errors import PlanError
from perseus.io import load_profile, read_frontier, write_frontier
from perseus.job import make_job
from perseus.plan import Frontier
from perseus.runtime.planning import OfflineProfile, OtherGpuWarning, PlanFile
from perseus.runtime.session import RankSession, SessionOptions
from perseus.schedule import build_schedule

pytestmark = pytest.mark.filterwarnings("ignore::perseus.runtime.emulation.EmulationOverrunWarning")

STAGES, MICROBATCHES = 8, 2


def _a100_plan() -> Frontier:
    job = make_job(load_profile("a100"), "1f1b", STAGES, MICROBATCHES, blocking_power_w=83.64)
    return job.frontier([job.point(job.allmax())])


def _session(gpu: SimulatedGPU, plan: object) -> RankSession:
    schedule = build_schedule("1f1b", STAGES, MICROBATCHES)
    return RankSession(
        schedule,
        0,
        gpu=gpu,
        plan=plan,
        options=SessionOptions(watchdog=False, handle_signals=False),
    )  # type: ignore[arg-type]


def test_bundled_a100_plan_on_a_simulated_h100_is_refused_in_one_line(tmp_path: Path) -> None:
    plan = _a100_plan()
    assert plan.job.gpu is not None and plan.job.gpu.name == "NVIDIA A100-SXM4-80GB"
    path = tmp_path / "plan.json"
    write_frontier(plan, path)
    assert read_frontier(path).job.gpu == plan.job.gpu  # the record survives the file
    h100 = SimulatedGPU.from_preset("h100", state_dir=tmp_path / "gpu", index=0)
    with pytest.raises(PlanError) as info:
        _session(h100, str(path)).start()
    message = str(info.value)
    assert "\n" not in message
    assert "NVIDIA A100-SXM4-80GB" in message and "NVIDIA H100 80GB HBM3" in message
    assert "OnlineProfile" in message and "allow_other_gpu=True" in message
    assert h100.locked_clock_mhz() is None  # refused before any clock was set


def test_with_the_opt_in_it_runs_with_one_warning(tmp_path: Path) -> None:
    h100 = SimulatedGPU.from_preset("h100", state_dir=tmp_path / "gpu", index=0)
    source = PlanFile(_a100_plan(), allow_other_gpu=True)
    warned = pytest.warns(OtherGpuWarning, match="NVIDIA H100 80GB HBM3")
    with warned as record, _session(h100, source) as session, session.iteration():
        for action in session.schedule.rank_actions[0]:
            with session.op(action):
                pass
    assert len([w for w in record if issubclass(w.category, OtherGpuWarning)]) == 1
    assert len(session.history) == 1


def test_a_profile_of_another_gpu_is_refused_and_the_same_gpu_runs(tmp_path: Path) -> None:
    profile = load_profile("a100")
    h100 = SimulatedGPU.from_preset("h100", state_dir=tmp_path / "h100", index=0)
    with pytest.raises(PlanError, match=re.escape("OfflineProfile(..., allow_other_gpu=True)")):
        _session(h100, OfflineProfile(profile)).start()
    a100 = SimulatedGPU.from_preset("a100", state_dir=tmp_path / "a100", index=0)
    with _session(a100, _a100_plan()) as session:
        assert session.frontier is not None


def test_a_plan_without_the_record_reads_and_says_it_is_unchecked(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    plan = _a100_plan()
    bare = plan.model_copy(update={"job": plan.job.model_copy(update={"gpu": None})})
    path = tmp_path / "old.json"
    write_frontier(bare, path)
    assert '"gpu"' not in path.read_text()  # written as before the record existed
    h100 = SimulatedGPU.from_preset("h100", state_dir=tmp_path / "gpu", index=0)
    logs = caplog.at_level(logging.WARNING, logger="perseus.runtime.planning")
    with logs, _session(h100, str(path)) as session:
        assert session.frontier is not None
    assert "has no GPU record: unchecked against NVIDIA H100 80GB HBM3" in caplog.text


def test_an_online_cache_measured_on_another_gpu_is_measured_again(tmp_path: Path) -> None:
    from perseus.device.presets import get_preset
    from perseus.io.profile_files import write_profile_csv
    from perseus.runtime.planning import OnlineProfile, PlanContext

    cache = tmp_path / "cache" / "profile.csv"
    cache.parent.mkdir(mode=0o700)
    write_profile_csv(load_profile("a100"), cache)
    schedule = build_schedule("1f1b", STAGES, MICROBATCHES)
    here = PlanContext(schedule, 0, None, 83.64, get_preset("h100").identity())
    assert OnlineProfile(cache=cache).plan(here) is None  # sweep again on this GPU
    same = PlanContext(schedule, 0, None, 83.64, get_preset("a100").identity())
    planned = OnlineProfile(cache=cache).plan(same)
    assert planned is not None and planned.frontier.job.gpu == load_profile("a100").gpu
