"""A StragglerRuntime on a RankSession: the acknowledgement of a hint names the iteration the
hint was read at, whether the session reads an iteration's figures at once or one late."""

from __future__ import annotations

from pathlib import Path

import pytest

from perseus.device.simulated import SimulatedGPU
from perseus.io import load_profile
from perseus.runtime.emulation import scale_profile, take_stages
from perseus.runtime.straggler.switching import StragglerRuntime, read_ack, set_hint

torch_dist = pytest.importorskip("torch.distributed")
BLOCKING_W = 83.64


def _run(session, store):  # type: ignore[no-untyped-def]
    from tests.runtime.test_rank_session import _iteration

    with session:
        plan = session.frontier
        assert plan is not None
        runtime = StragglerRuntime(plan, pipeline_index=0, num_pipelines=2, store=store)
        session.add_boundary_hook(runtime)
        for i in range(6):
            if i == 3:  # set while iteration 3 runs: read at the boundary ending it
                token = set_hint(store, 1, 10 * plan.points[0].time_s)
            _iteration(session)
    return token


@pytest.mark.parametrize("wait_for_figures", [False, True])
def test_a_real_gpus_hint_is_acknowledged_at_the_iteration_that_ended(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, wait_for_figures: bool
) -> None:
    """On a real GPU the boundary ending iteration k hands the hooks iteration k - 1's
    figures; a hint read there is in force from k + 1. The acknowledgement said k - 1 (one
    iteration early), as the power cap's did (test_power_session)."""
    from tests.runtime.test_agent import _cuda_like_events, counting_gpu
    from tests.runtime.test_rank_session import _session as real_gpu_session

    monkeypatch.setenv("PERSEUS_LOCK_DIR", str(tmp_path))
    profile = scale_profile(take_stages(load_profile("a100"), 2), 0.02)
    store = torch_dist.HashStore()
    session = real_gpu_session(
        counting_gpu()[0], profile, events=_cuda_like_events(), wait_for_figures=wait_for_figures
    )
    token = _run(session, store)
    assert read_ack(store, 1) == (token, 3)
    assert [s.point_index for s in session.history] == [0, 0, 0, 0, 1, 1]  # from 3 + 1


def test_an_emulated_hint_is_acknowledged_at_the_iteration_that_ended(tmp_path: Path) -> None:
    from tests.runtime.test_rank_session import _session

    profile = scale_profile(take_stages(load_profile("a100"), 2), 0.02)
    gpu = SimulatedGPU.from_profile(
        profile, blocking_power_w=BLOCKING_W, state_dir=tmp_path, set_latency_s=0.0
    )
    session = _session(gpu, profile)
    store = torch_dist.HashStore()
    token = _run(session, store)
    assert read_ack(store, 1) == (token, 3)
    assert [s.point_index for s in session.history] == [0, 0, 0, 0, 1, 1]


def test_a_runtime_moved_to_a_new_session_acknowledges_that_sessions_iteration(
    tmp_path: Path,
) -> None:
    """A straggler runtime kept across a restart (a new session, the same hook: its decisions
    kept) counted the closed session's iterations: a hint read at the new session's
    iteration 1 was acknowledged at the old one's last (5)."""
    from tests.runtime.test_rank_session import _iteration, _session

    profile = scale_profile(take_stages(load_profile("a100"), 2), 0.02)
    store = torch_dist.HashStore()
    for run in range(2):
        gpu = SimulatedGPU.from_profile(
            profile, blocking_power_w=BLOCKING_W, state_dir=tmp_path / str(run), set_latency_s=0.0
        )
        with _session(gpu, profile) as session:
            assert session.frontier is not None
            if run == 0:
                runtime = StragglerRuntime(
                    session.frontier, pipeline_index=0, num_pipelines=2, store=store
                )
            session.add_boundary_hook(runtime)
            for i in range(6 if run == 0 else 3):
                if run == 1 and i == 1:
                    token = set_hint(store, 1, 10 * session.frontier.points[0].time_s)
                _iteration(session)
    assert read_ack(store, 1) == (token, 1)
