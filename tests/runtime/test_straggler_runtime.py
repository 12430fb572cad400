"""Straggler detection and hints without a process group (the decision is pure)."""

from __future__ import annotations

import pytest

from perseus.errors import ConfigError
from perseus.io import load_profile
from perseus.job import make_job
from perseus.plan import PlanPoint
from perseus.runtime.emulation import take_stages
from perseus.runtime.straggler.switching import (
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


class _CountingStore:
    """A store that counts the calls made to it (``num_keys`` hidden when ``counts_keys`` is
    False: a store read key by key)."""

    def __init__(self, store, counts_keys: bool = True) -> None:
        self._store, self._counts_keys, self.calls = store, counts_keys, 0

    def __getattr__(self, name: str):
        if name == "num_keys" and not self._counts_keys:
            raise AttributeError(name)
        method = getattr(self._store, name)

        def counted(*args, **kwargs):
            self.calls += 1
            return method(*args, **kwargs)

        return counted


def test_rank_0_reads_the_hints_in_one_store_call_per_iteration_and_sees_every_change(frontier):
    """Rank 0 read two keys per pipeline at every boundary (check and get), every other rank
    waiting for it at the all-reduce: with a store that counts its keys, one call while no key
    appears, and what every exchange returns and acknowledges is as read key by key."""
    from perseus.runtime.straggler.switching import read_ack, read_hint_entry

    def ack(store, k):  # (acknowledges the hint in force, at which iteration)
        entry, got = read_hint_entry(store, k), read_ack(store, k)
        return got and (got[0] == (entry[1] if entry else "-"), got[1])

    d = 64
    stores = [_CountingStore(torch_dist.HashStore(), counts) for counts in (True, False)]
    fast, ref = (StragglerRuntime(frontier, pipeline_index=0, num_pipelines=d, store=s) for s in stores)  # fmt: skip
    steps = [
        lambda s: None,
        lambda s: None,
        lambda s: set_hint(s, 5, 2.5),
        lambda s: None,
        lambda s: set_hint(s, 5, 3.5),  # a new value under a key already there
        lambda s: set_hint(s, 63, 1.5),
        lambda s: clear_hint(s, 5),
        lambda s: None,
    ]
    calls = []
    for iteration, step in enumerate(steps):
        for s in stores:
            step(s._store)
        before = stores[0].calls
        got = fast.exchange(1.0, iteration)
        calls.append(stores[0].calls - before)
        assert got == ref.exchange(1.0, iteration), iteration
        for k in range(d):
            assert ack(stores[0]._store, k) == ack(stores[1]._store, k), (iteration, k)
    assert read_ack(stores[0]._store, 5) == ("-", 6) and ack(stores[0]._store, 63) == (True, 5)
    assert calls[1] == 1  # nothing new: the key count only
    assert calls[3] == 1 + 2  # pipeline 5's key: check and get
    assert max(calls) < 2 * d


def test_a_store_that_cannot_count_its_keys_is_read_key_by_key(frontier):
    class NoCount(_CountingStore):
        def num_keys(self):
            raise RuntimeError("not implemented")

    store = NoCount(torch_dist.HashStore())
    rt = StragglerRuntime(frontier, pipeline_index=0, num_pipelines=4, store=store)
    assert rt.exchange(1.0, 0) == (1.0, 0.0, 0.0, 0.0)
    set_hint(store._store, 2, 2.5)
    assert rt.exchange(1.0, 1) == (1.0, 0.0, 2.5, 0.0)
