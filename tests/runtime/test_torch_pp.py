"""The torch adapter: torch's executed orders, as perseus schedules and DAGs, without a process group."""

from __future__ import annotations

import numpy as np
import pytest

from perseus.dag import build_dag
from perseus.errors import ConfigError, ScheduleError
from perseus.runtime.engines import torch_pp
from perseus.schedule import Action, Kind, build_schedule, validate_schedule

pytest.importorskip("torch.distributed.pipelining")

# (ranks, microbatches); 1F1B needs M >= ranks in torch, interleaved needs M % rounds == 0.
CASES = [
    (1, 1),
    (2, 2),
    (2, 3),
    (2, 4),
    (2, 7),
    (3, 3),
    (3, 6),
    (3, 8),
    (4, 4),
    (4, 8),
    (4, 12),
    (5, 10),
    (8, 8),
    (8, 16),
]


def _same_dag(a, b) -> None:
    ga, gb = build_dag(a), build_dag(b)
    assert ga.actions == gb.actions
    np.testing.assert_array_equal(ga.rank_start, gb.rank_start)
    np.testing.assert_array_equal(ga.edge_src, gb.edge_src)
    np.testing.assert_array_equal(ga.edge_dst, gb.edge_dst)
    assert a.stage_to_rank == b.stage_to_rank


@pytest.mark.parametrize(("ranks", "microbatches"), CASES)
@pytest.mark.parametrize(
    ("name", "virtual"), [("gpipe", 1), ("1f1b", 1), ("interleaved", 2), ("interleaved", 3)]
)
def test_torch_dag_equals_perseus_builder(name, virtual, ranks, microbatches):
    if name == "interleaved" and microbatches % max(1, microbatches // ranks):
        pytest.skip("torch's interleaved needs whole rounds")
    theirs = torch_pp.schedule_from_torch_class(name, ranks, microbatches, virtual)
    ours = build_schedule(name, ranks * virtual, microbatches, virtual_stages=virtual)
    _same_dag(theirs, ours)


def test_1f1b_last_rank_is_traced_not_read_from_pipeline_order():
    """torch 2.13's Schedule1F1B.pipeline_order lists F1..FM on the last rank; we trace."""
    s = torch_pp.schedule_from_torch_class("1f1b", 4, 8)
    last = s.rank_actions[3]
    assert last[:4] == (
        Action(3, Kind.F, 0),
        Action(3, Kind.B, 0),
        Action(3, Kind.F, 1),
        Action(3, Kind.B, 1),
    )
    assert max(a.microbatch_index for a in last) == 7


@pytest.mark.parametrize(
    ("cls", "ranks", "microbatches"),
    [
        ("InterleavedZeroBubble", 4, 8),
        ("InterleavedZeroBubble", 2, 4),
        ("ZBVZeroBubble", 4, 8),
        ("ZBVZeroBubble", 2, 6),
        ("LoopedBFS", 3, 6),
    ],
)
def test_other_torch_schedules_convert_and_validate(cls, ranks, microbatches):
    s = torch_pp.schedule_from_torch_class(cls, ranks, microbatches, 2)
    validate_schedule(s)
    assert s.num_stages == 2 * ranks
    graph = build_dag(s)
    assert graph.num_nodes == len({a for acts in s.rank_actions for a in acts})
    if "Zero" in cls:
        assert s.has_weight_actions
    if cls == "ZBVZeroBubble":  # V placement: rank 0 holds the first and the last stage
        assert s.stage_to_rank[0] == s.stage_to_rank[-1] == 0


def test_dualpipev_does_not_fit_with_a_clear_error():
    with pytest.raises(ScheduleError, match="mixes full backwards"):
        torch_pp.schedule_from_torch_class("DualPipeV", 4, 8, 2)


def test_torch_size_errors_become_schedule_errors():
    with pytest.raises(ScheduleError, match="Schedule1F1B rejects"):
        torch_pp.schedule_from_torch_class("1f1b", 4, 2)


def test_unknown_class_is_a_config_error():
    with pytest.raises(ConfigError, match="unknown torch pipeline schedule"):
        torch_pp.torch_class_for("NoSuchSchedule")


def test_old_torch_version_is_rejected(monkeypatch):
    import torch

    monkeypatch.setattr(torch, "__version__", "2.1.0")
    with pytest.raises(ConfigError, match="not supported"):
        torch_pp.check_torch_version()


def test_stage_compute_methods_exist_on_torch_stage():
    from torch.distributed.pipelining.stage import _PipelineStageBase

    for method in torch_pp.STAGE_COMPUTE_METHODS:
        assert callable(getattr(_PipelineStageBase, method))
