"""DeepSpeed adapter: TrainSchedule as a perseus schedule, and a PipelineEngine on CPU/gloo
with perseus's hooks on its forward/backward instruction handlers."""

from __future__ import annotations

from typing import Any

import pytest

from perseus.errors import ConfigError, ScheduleError
from perseus.schedule import one_f_one_b
from tests.runtime._engines import Recorder, run_ranks, same_dag

pytest.importorskip("deepspeed")
ds = pytest.importorskip("perseus.runtime.engines.deepspeed")

CASES = [(1, 1), (1, 4), (2, 1), (2, 2), (2, 5), (3, 3), (3, 7), (4, 3), (4, 8), (5, 10), (8, 16)]


@pytest.mark.parametrize(("stages", "microbatches"), CASES)
def test_train_schedule_dag_equals_perseus_1f1b(stages, microbatches):
    theirs = ds.deepspeed_schedule(stages, microbatches)
    assert theirs.name == "deepspeed-1f1b"
    same_dag(theirs, one_f_one_b(stages, microbatches))


def test_bad_sizes_and_objects_are_refused():
    with pytest.raises(ScheduleError, match=">= 1"):
        ds.deepspeed_schedule(0, 4)
    with (
        pytest.raises(ConfigError, match="PipelineEngine"),
        ds.instrument_deepspeed(object(), Recorder()),
    ):
        pass


def _deepspeed_rank(rank: int, world: int, microbatches: int) -> dict[str, Any]:
    import logging

    import deepspeed
    import torch
    from deepspeed.pipe import LayerSpec, PipelineModule
    from torch import nn

    ds.skip_cpu_shm_op()
    deepspeed.init_distributed(dist_backend="gloo")
    deepspeed.utils.logger.setLevel(logging.ERROR)
    hidden = 8
    recorder = Recorder()

    class Layer(nn.Linear):
        def forward(self, x: Any) -> Any:
            recorder.mark("F")
            return torch.tanh(super().forward(x))

    torch.manual_seed(0)
    module = PipelineModule(
        layers=[LayerSpec(Layer, hidden, hidden) for _ in range(world)],
        num_stages=world,
        loss_fn=nn.MSELoss(),
        partition_method="uniform",
    )
    config = {
        "train_micro_batch_size_per_gpu": 2,
        "gradient_accumulation_steps": microbatches,
        "optimizer": {"type": "SGD", "params": {"lr": 1e-2}},
        "steps_per_print": 10**9,
    }
    engine, *_ = deepspeed.initialize(
        model=module, model_parameters=list(module.parameters()), config=config
    )
    data = [(torch.randn(2, hidden), torch.randn(2, hidden)) for _ in range(4 * microbatches)]
    it = iter(data)
    losses = []
    with ds.instrument_deepspeed(engine, recorder) as seen:
        for _ in range(2):
            losses.append(float(engine.train_batch(it)))
        engine.eval_batch(it)  # an InferenceSchedule: not instrumented
    assert "_INSTRUCTION_MAP" not in vars(engine)
    return {"seen": [str(a) for a in seen], "events": recorder.events, "losses": losses}


def test_pipeline_engine_on_gloo_hooks_see_every_pass_in_train_schedule_order():
    microbatches = 4
    results = run_ranks(2, _deepspeed_rank, microbatches)
    expected = ds.deepspeed_schedule(2, microbatches)
    for rank, got in enumerate(results):
        order = [str(a) for a in expected.rank_actions[rank]]
        assert got["seen"] == order * 2
        events = [e for e in got["events"]]
        # Forwards enter, compute, exit; the eval batch's forwards compute outside any action.
        n_train = 2 * sum(1 for a in order if "F" in a)
        computes = [i for i, e in enumerate(events) if e[0] == "compute"]
        assert len(computes) == n_train + microbatches
        for i in computes[:n_train]:
            assert events[i - 1][0] == "enter" and events[i + 1][0] == "exit"
    assert all(loss > 0 for loss in results[-1]["losses"])


def test_version_check_names_what_is_missing(monkeypatch):
    from deepspeed.runtime.pipe import schedule
    from deepspeed.runtime.pipe.engine import PipelineEngine

    monkeypatch.setattr(
        PipelineEngine,
        "_INSTRUCTION_MAP",
        {schedule.ForwardPass: PipelineEngine._exec_forward_pass},
    )
    with pytest.raises(ConfigError, match=r"_INSTRUCTION_MAP\[BackwardPass\]"):
        ds.check_deepspeed_version()
    monkeypatch.delattr(PipelineEngine, "_exec_schedule")
    with pytest.raises(ConfigError, match=r"lacks .*PipelineEngine\._exec_schedule"):
        ds.check_deepspeed_version()


def test_missing_deepspeed_is_an_install_hint(monkeypatch):
    import sys

    monkeypatch.setitem(sys.modules, "deepspeed", None)
    with pytest.raises(
        ConfigError, match=r"DS_BUILD_OPS=0 pip install 'perseus-energy\[deepspeed\]'"
    ):
        ds.check_deepspeed_version()


def test_plans_from_perseus_frontier_fit_deepspeed():
    from perseus.io import load_profile
    from perseus.runtime.emulation import take_stages
    from perseus.runtime.planning import job_for_schedule

    job = job_for_schedule(ds.deepspeed_schedule(4, 8), take_stages(load_profile("a100"), 4), 83.6)
    assert job.spec.schedule == "1f1b"


def test_engine_adapter_keeps_no_action_per_op(monkeypatch):
    """DeepSpeedEngine.attach lives for the whole run: its hooks must not keep every action run
    (the session keeps its own bounded records); a direct instrument_deepspeed still lists them."""
    import contextlib

    import torch
    from deepspeed.runtime.pipe import schedule as sched
    from deepspeed.runtime.pipe.engine import PipelineEngine

    class FakeEngine(PipelineEngine):
        """Only what the adapter touches: its instruction map runs no-op passes."""

        _INSTRUCTION_MAP = {sched.ForwardPass: lambda self, **kw: None} | {
            sched.BackwardPass: lambda self, **kw: None
        }

        def __init__(self) -> None:
            torch.nn.Module.__init__(self)
            self.stage_id = 0
            self.num_stages = 1

        def gradient_accumulation_steps(self) -> int:
            return 4

        def _exec_schedule(self, pipe_schedule: Any) -> None:
            for step in pipe_schedule.steps():
                for cmd in step:
                    if type(cmd) in self._INSTRUCTION_MAP:
                        self._INSTRUCTION_MAP[type(cmd)](self, **cmd.kwargs)

    kept: list[list[Any]] = []
    real = ds.instrument_deepspeed

    @contextlib.contextmanager
    def spy(*args: Any, **kwargs: Any):
        with real(*args, **kwargs) as seen:
            kept.append(seen)
            yield seen

    monkeypatch.setattr(ds, "instrument_deepspeed", spy)
    engine = FakeEngine()
    recorder = Recorder()
    undo = ds.DeepSpeedEngine(engine).attach(recorder, lambda: False)
    try:
        for _ in range(50):  # iterations
            engine._exec_schedule(sched.TrainSchedule(micro_batches=4, stages=1, stage_id=0))
    finally:
        undo()
    assert len(recorder.events) == 2 * 400  # every op ran inside the factory
    assert kept == [[]]
    with real(engine, Recorder()) as seen:
        engine._exec_schedule(sched.TrainSchedule(micro_batches=1, stages=1, stage_id=0))
    assert [str(a) for a in seen] == ["0F0", "0B0"]
