"""RankSession's power wiring: ``power_schedule=`` and ``power_store=`` on one process."""

from __future__ import annotations

from pathlib import Path

import pytest

from perseus.device.simulated import SimulatedGPU
from perseus.errors import ConfigError, PlanError
from perseus.io import load_profile
from perseus.io.power_files import ScheduleFile
from perseus.job import make_job
from perseus.plan import points_sha256
from perseus.runtime.emulation import scale_profile, take_stages
from perseus.runtime.planning import OnlineProfile
from perseus.runtime.power import set_cap
from perseus.runtime.session import RankSession, SessionOptions
from perseus.schedule import build_schedule

torch_dist = pytest.importorskip("torch.distributed")
BLOCKING_W = 83.64


@pytest.fixture
def setup(tmp_path: Path):  # type: ignore[no-untyped-def]
    profile = scale_profile(take_stages(load_profile("a100"), 2), 0.02)
    gpu = SimulatedGPU.from_profile(
        profile, blocking_power_w=BLOCKING_W, state_dir=tmp_path, set_latency_s=0.0
    )
    job = make_job(profile, "1f1b", 2, 4, blocking_power_w=BLOCKING_W)
    plan = job.frontier(
        [job.point(job.allmax()), job.point([1095] * job.graph.num_nodes)]
    )  # 0: all-max (fast, high power), 1: 1095 MHz (slow, lower power)
    schedule = tmp_path / "schedule.json"
    doc = ScheduleFile(
        frontier_points_sha256=points_sha256(plan.points),
        iterations=6,
        deadline_s=100.0,
        cost=1.0,
        lp_cost=1.0,
        baseline_cost=None,
        baseline_point_index=0,
        intervals=(),
        segments=((0, 1), (2, 0), (4, 1)),
    )
    schedule.write_text(doc.model_dump_json())
    return gpu, plan, schedule


def _session(gpu, plan, **kwargs) -> RankSession:  # type: ignore[no-untyped-def]
    options = SessionOptions(
        blocking_power_w=BLOCKING_W, watchdog=False, handle_signals=False, **kwargs
    )
    return RankSession(build_schedule("1f1b", 2, 4), 0, gpu=gpu, plan=plan, options=options)


def _iteration(session: RankSession) -> None:
    with session.iteration():
        for action in session.schedule.rank_actions[session.rank]:
            with session.op(action):
                pass


def test_session_follows_the_schedule_and_a_cap(setup) -> None:  # type: ignore[no-untyped-def]
    gpu, plan, schedule = setup
    store = torch_dist.HashStore()
    with _session(gpu, plan, power_schedule=schedule, power_store=store) as session:
        for i in range(9):
            if i == 7:  # a cap only point 1 meets, set before the boundary that ends iteration 6
                set_cap(store, plan.points[1].avg_power_w * 1.0001)
            _iteration(session)
    ran = [s.point_index for s in session.history]
    assert ran == [1, 1, 0, 0, 1, 1, 1, 1, 1]  # the last segment stays; the cap keeps 1
    assert [d.reason for d in session.power.decisions][-1] == "schedule"
    assert session.history[2].predicted_time_s == plan.points[0].time_s


def test_cap_alone_moves_the_fastest_plan_down(setup) -> None:  # type: ignore[no-untyped-def]
    gpu, plan, _ = setup
    store = torch_dist.HashStore()
    with _session(gpu, plan, power_store=store) as session:
        for i in range(5):
            if i == 2:  # set after iteration 1 ended: read when iteration 2 ends, in force from 3
                set_cap(store, plan.points[1].avg_power_w * 1.0001)
            _iteration(session)
    assert [s.point_index for s in session.history] == [0, 0, 0, 1, 1]


def test_schedule_of_another_frontier_or_with_online_profiling_is_refused(setup) -> None:  # type: ignore[no-untyped-def]
    gpu, plan, schedule = setup
    with pytest.raises(PlanError, match="made for another frontier"):
        _session(gpu, plan.with_points(plan.points[:1]), power_schedule=schedule).start()
    options = SessionOptions(blocking_power_w=BLOCKING_W, power_schedule=schedule)
    with pytest.raises(ConfigError, match="power_schedule= needs a frontier"):
        RankSession(build_schedule("1f1b", 2, 4), 0, gpu=gpu, plan=OnlineProfile(), options=options)


def test_a_cap_holds_over_a_straggler_hook_added_after_start(setup) -> None:  # type: ignore[no-untyped-def]
    """A straggler runtime (this pipeline the slowest: it asks for the fastest plan every
    iteration) added after start, so asked after the power hook: the cap the power hook
    acknowledged still holds from the next iteration. Before, the straggler's plan replaced
    the power hook's at every boundary and the job ran above its cap for good."""
    from perseus.runtime.power import read_cap_ack
    from perseus.runtime.straggler.switching import StragglerRuntime

    gpu, plan, _ = setup
    store = torch_dist.HashStore()
    with _session(gpu, plan, power_store=store) as session:
        session.add_boundary_hook(StragglerRuntime(plan, pipeline_index=0, num_pipelines=1))
        for i in range(6):
            if i == 3:  # a cap only point 1 meets, read at the boundary ending iteration 3
                token = set_cap(store, plan.points[1].avg_power_w * 1.0001)
            _iteration(session)
    assert [s.point_index for s in session.history] == [0, 0, 0, 0, 1, 1]
    assert read_cap_ack(store) == (token, 3)


def test_a_cap_holds_over_other_hooks_while_its_hook_is_attached(setup) -> None:  # type: ignore[no-untyped-def]
    """attach_power on a started session (the documented way without the options) is the
    session's power hook as well: its cap holds over a straggler runtime added after it;
    once the power hook is removed, its last cap no longer lowers the others' plans."""
    from perseus.runtime.power import attach_power
    from perseus.runtime.straggler.switching import StragglerRuntime

    gpu, plan, _ = setup
    store = torch_dist.HashStore()
    set_cap(store, plan.points[1].avg_power_w * 1.0001)
    with _session(gpu, plan) as session:
        power = attach_power(session, None, store)
        assert session.power is power
        session.add_boundary_hook(StragglerRuntime(plan, pipeline_index=0, num_pipelines=1))
        for _ in range(3):
            _iteration(session)
        session.remove_boundary_hook(power)
        for _ in range(3):
            _iteration(session)
    assert [s.point_index for s in session.history] == [0, 1, 1, 1, 0, 0]


def test_a_real_gpus_cap_is_acknowledged_at_the_iteration_that_ended(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """On a real GPU the boundary ending iteration k hands the hooks iteration k - 1's
    figures; a cap read there is in force from k + 1. The acknowledgement said k - 1 (a fleet
    member recorded the plan in force from k, an iteration early)."""
    from perseus.runtime.power import read_cap_ack
    from tests.runtime.test_agent import _cuda_like_events, counting_gpu
    from tests.runtime.test_rank_session import _session as real_gpu_session

    monkeypatch.setenv("PERSEUS_LOCK_DIR", str(tmp_path))
    profile = scale_profile(take_stages(load_profile("a100"), 2), 0.02)
    store = torch_dist.HashStore()
    session = real_gpu_session(
        counting_gpu()[0], profile, events=_cuda_like_events(), power_store=store
    )
    with session:
        plan = session.frontier
        assert plan is not None
        for i in range(6):
            if i == 3:  # set while iteration 3 runs: read at the boundary ending it
                token = set_cap(store, plan.points[1].avg_power_w * 1.0001)
            _iteration(session)
    assert read_cap_ack(store) == (token, 3)
    assert [s.point_index for s in session.history] == [0, 0, 0, 0, 1, 1]  # from 3 + 1


def test_a_straggler_hook_added_before_start_is_not_undone_by_the_power_hook(setup) -> None:  # type: ignore[no-untyped-def]
    """Hooks added before start() came before the power hook start() attaches: the power
    hook put its plan back at every other boundary, and the pipeline flapped between the
    straggler runtime's plan and the fastest. The power hook is asked first wherever it is."""
    from perseus.runtime.straggler.switching import StragglerRuntime, set_hint

    gpu, plan, _ = setup
    hints, caps = torch_dist.HashStore(), torch_dist.HashStore()
    set_hint(hints, 1, 10 * plan.points[0].time_s)  # the other pipeline straggles: slow down
    session = _session(gpu, plan, power_store=caps)
    session.add_boundary_hook(
        StragglerRuntime(plan, pipeline_index=0, num_pipelines=2, store=hints)
    )
    with session:
        for _ in range(6):
            _iteration(session)
    assert [s.point_index for s in session.history] == [0, 1, 1, 1, 1, 1]
