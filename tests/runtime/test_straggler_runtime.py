"""Straggler detection and hints without a process group (the decision is pure)."""

from __future__ import annotations

import pytest

from perseus.errors import ConfigError
from perseus.io import load_profile
from perseus.job import make_job
from perseus.plan import PlanPoint
from perseus.runtime.emulation import take_stages
from perseus.runtime.straggler.switching import (
    DECISIONS_KEPT,
    StragglerRuntime,
    clear_hint,
    hint_key,
    read_hint,
    set_hint,
)

torch_dist = pytest.importorskip("torch.distributed")


@pytest.fixture(scope="module")
def frontier():
    job = make_job(take_stages(load_profile("a100"), 4), "1f1b", 4, 4, blocking_power_w=83.64)
    fast = job.point(job.allmax())
    slow = PlanPoint(
        time_s=fast.time_s * 1.15, energy_j=fast.energy_j * 0.8, freqs_mhz=fast.freqs_mhz
    )
    return job.frontier([fast, slow])


def test_non_straggler_switches_and_straggler_keeps_fastest(frontier):
    t = frontier.fastest.time_s
    pipes = [StragglerRuntime(frontier, pipeline_index=k, num_pipelines=2) for k in range(2)]
    times = (t, 1.2 * t)  # pipeline 1 straggles
    a, b = (p.decide(0, times) for p in pipes)
    assert (a.point_index, b.point_index) == (1, 0)
    assert a.straggler == b.straggler == 1
    # The slowed-by-choice pipeline 0 reports its intrinsic time, not its plan's.
    assert pipes[0].intrinsic_time_s(1.15 * t) == pytest.approx(t)
    # Recovery: everybody back to the fastest plan.
    assert pipes[0].decide(1, (t, t)).point_index == 0


def test_baseline_never_switches(frontier):
    rt = StragglerRuntime(frontier, pipeline_index=0, num_pipelines=2, adaptive=False)
    assert rt.decide(0, (1.0, 10.0)).point_index == 0


def test_a_runtime_keeps_the_latest_decisions(frontier):
    # A run of weeks decides every iteration: only the latest DECISIONS_KEPT are kept.
    rt = StragglerRuntime(frontier, pipeline_index=0, num_pipelines=2)
    t = frontier.fastest.time_s
    for i in range(DECISIONS_KEPT + 3):
        rt.decide(i, (t, 1.2 * t))
    assert len(rt.decisions) == DECISIONS_KEPT
    assert [d.iteration for d in (rt.decisions[0], rt.decisions[-1])] == [3, DECISIONS_KEPT + 2]
    assert rt.decisions[-1].point_index == rt.point_index == 1


def test_exchange_without_process_group_uses_store_hints(frontier):
    store = torch_dist.HashStore()
    rt = StragglerRuntime(frontier, pipeline_index=0, num_pipelines=2, store=store)
    assert rt.exchange(1.0) == (1.0, 0.0)
    set_hint(store, 1, 2.5)
    assert read_hint(store, 1) == 2.5
    assert rt.exchange(1.0) == (1.0, 2.5)
    clear_hint(store, 1)
    clear_hint(store, 1)  # idempotent
    assert read_hint(store, 1) is None
    assert hint_key(3) == "perseus/straggler/3"


def test_bad_values_are_config_errors(frontier):
    with pytest.raises(ConfigError):
        StragglerRuntime(frontier, pipeline_index=2, num_pipelines=2)
    with pytest.raises(ConfigError):
        set_hint(torch_dist.HashStore(), 0, -1.0)


class _ClearedBetweenCheckAndGet:
    """A store where an operator's ``straggler clear`` lands between the job's ``check`` and
    its ``get`` (the race a loaded CI machine hit: the job then waited for the key until the
    store's timeout and raised)."""

    def __init__(self, store, pipeline_index: int) -> None:
        self.store, self.pipeline_index = store, pipeline_index

    def check(self, keys):
        found = self.store.check(keys)
        clear_hint(self.store, self.pipeline_index)
        return found

    def get(self, key):
        return self.store.get(key)


def test_a_clear_between_the_jobs_check_and_get_reads_as_no_hint():
    from datetime import timedelta

    store = torch_dist.HashStore()
    store.set_timeout(timedelta(seconds=1))
    set_hint(store, 1, 2.5)
    assert read_hint(_ClearedBetweenCheckAndGet(store, 1), 1) is None


def test_the_time_is_scaled_by_the_plan_the_iteration_ran(frontier):
    """On a real GPU the figures come one iteration late: the stats after a switch are of the
    plan before it. Pipeline 0 slowed to the cheap plan (1.15 x) for pipeline 1's hint, then
    went back to the fastest when it was cleared; the iteration still on the cheap plan must
    report its intrinsic time, not 1.15 x (which made pipeline 0 the straggler every other
    pipeline slowed down to: pipelines took turns)."""
    from types import SimpleNamespace

    store = torch_dist.HashStore()
    t = frontier.fastest.time_s
    rt = StragglerRuntime(frontier, pipeline_index=0, num_pipelines=2, store=store)

    def boundary(iteration: int, ran: int, time_s: float):  # type: ignore[no-untyped-def]
        stats = SimpleNamespace(
            phase="run", iteration=iteration, point_index=ran, compute_time_s=time_s
        )
        return rt(stats)

    set_hint(store, 1, 1.2 * t)
    assert boundary(0, 0, t) == (frontier, 1)
    clear_hint(store, 1)
    assert boundary(1, 0, t) == (frontier, 0)  # iteration 1 ran the fastest plan still
    boundary(2, 1, 1.15 * t)  # iteration 2 ran the cheap plan decided after iteration 0
    assert rt.decisions[-1].pipeline_times_s[0] == pytest.approx(t)
    assert rt.decisions[-1].point_index == 0


class _CountingStore:
    """A store that records the calls the job makes on it."""

    def __init__(self, store) -> None:  # type: ignore[no-untyped-def]
        self.store, self.calls = store, []

    def __getattr__(self, name: str):  # type: ignore[no-untyped-def]
        if name not in ("add", "check", "get", "set"):
            raise AttributeError(name)
        method = getattr(self.store, name)

        def call(*args):  # type: ignore[no-untyped-def]
            self.calls.append(name)
            return method(*args)

        return call


def test_the_hints_are_read_again_only_when_one_changed(frontier):
    """Rank 0 read every pipeline's hint at every boundary (check and get: two store round
    trips per pipeline, 9.8 ms per iteration at 512 pipelines). It reads one counter now, and
    the hints when set_hint or clear_hint moved it; every change is still read and
    acknowledged at the boundary after it."""
    from perseus.runtime.straggler.switching import read_ack

    store = torch_dist.HashStore()
    counting = _CountingStore(store)
    first = set_hint(store, 1, 2.5)
    rt = StragglerRuntime(frontier, pipeline_index=0, num_pipelines=64, store=counting)
    assert rt.exchange(1.0, 0)[:3] == (1.0, 2.5, 0.0)  # the first boundary reads them all
    assert read_ack(store, 1) == (first, 0)
    for i in (1, 2, 3):
        counting.calls.clear()
        assert rt.exchange(1.0, i)[:3] == (1.0, 2.5, 0.0)
        assert counting.calls == ["add"]  # the counter only
    token = set_hint(store, 2, 3.0)
    assert rt.exchange(1.0, 4)[:3] == (1.0, 2.5, 3.0)
    assert read_ack(store, 2) == (token, 4)
    counting.calls.clear()
    rt.exchange(1.0, 5)
    assert counting.calls == ["add"]
    clear_hint(store, 1)
    assert rt.exchange(1.0, 6)[:3] == (1.0, 0.0, 3.0)
    assert read_ack(store, 1) == ("-", 6)


def test_a_second_slowed_pipeline_keeps_a_plan_that_finishes_within_t_prime(frontier):
    # Pipeline 2 straggles at 1.2x, pipeline 1 at 1.1x: the 1.15x plan would run 1.1 x 1.15 =
    # 1.265x on pipeline 1, slowing the whole job past the straggler; pipeline 0 still slows.
    t = frontier.fastest.time_s
    times = (t, 1.1 * t, 1.2 * t)
    pipes = [StragglerRuntime(frontier, pipeline_index=k, num_pipelines=3) for k in range(3)]
    chosen = [p.decide(0, times).point_index for p in pipes]
    assert chosen == [1, 0, 0]
    for k, index in enumerate(chosen):
        assert times[k] / t * frontier.points[index].time_s <= 1.2 * t
