"""Megatron-Core adapter: its schedules as perseus schedules, and its own schedule functions
run on CPU/gloo with perseus's hooks around every forward and backward step."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from perseus.errors import ConfigError, ScheduleError
from perseus.schedule import Kind, interleaved_1f1b, one_f_one_b
from tests.runtime._engines import Recorder, run_ranks, same_dag

torch = pytest.importorskip("torch")
pytest.importorskip("megatron.core")
megatron = pytest.importorskip("perseus.runtime.engines.megatron")

# (ranks, microbatches): Megatron's 1F1B takes any M >= 1.
CASES_1F1B = [(2, 1), (2, 2), (2, 5), (3, 3), (3, 7), (4, 3), (4, 4), (4, 8), (5, 10), (8, 16)]
# (ranks, microbatches, chunks per rank) with the default group size (= ranks).
CASES_INTERLEAVED = [
    (2, 2, 2),
    (2, 4, 2),
    (2, 6, 2),
    (2, 4, 4),
    (3, 6, 2),
    (3, 9, 3),
    (4, 4, 3),
    (4, 8, 2),
    (4, 12, 2),
    (8, 16, 2),
]


@pytest.mark.parametrize(("ranks", "microbatches"), CASES_1F1B)
def test_1f1b_dag_equals_perseus_builder(ranks, microbatches):
    ours = one_f_one_b(ranks, microbatches)
    theirs = megatron.megatron_schedule(ranks, microbatches)
    assert theirs.name == "megatron-1f1b"
    same_dag(theirs, ours)


@pytest.mark.parametrize(("ranks", "microbatches", "chunks"), CASES_INTERLEAVED)
def test_interleaved_dag_equals_perseus_builder(ranks, microbatches, chunks):
    ours = interleaved_1f1b(ranks * chunks, microbatches, chunks)
    theirs = megatron.megatron_schedule(ranks, microbatches, chunks)
    same_dag(theirs, ours)


@pytest.mark.parametrize(("ranks", "microbatches", "group"), [(2, 8, 4), (2, 8, 3), (3, 8, 4)])
def test_group_size_other_than_ranks_differs_from_builder_as_megatron_says(
    ranks, microbatches, group
):
    """With microbatch_group_size_per_vp_stage N != R Megatron runs N consecutive microbatches
    per chunk (torch's builder uses rounds of M // (M // R)); the order differs, stays valid,
    and each rank warms up with (V - 1) * N + 2 * (R - 1 - r) forwards."""
    s = megatron.megatron_schedule(ranks, microbatches, 2, group)
    for r, acts in enumerate(s.rank_actions):
        first_b = next(i for i, a in enumerate(acts) if a.kind is Kind.B)
        warmup = min(group + 2 * (ranks - 1 - r), 2 * microbatches)
        assert first_b == warmup + 1  # warm-up forwards, then the first steady forward
        assert [a.stage_index for a in acts[:group]] == [r] * group
    if microbatches % ranks == 0:
        assert s.rank_actions != interleaved_1f1b(2 * ranks, microbatches, 2).rank_actions


@pytest.mark.parametrize(
    ("ranks", "microbatches", "group", "words"),
    [(4, 8, 2, "between"), (4, 6, 4, "0 or >="), (2, 2, 3, "between")],
)
def test_sizes_megatron_refuses_are_refused(ranks, microbatches, group, words):
    with pytest.raises(ScheduleError, match=words):
        megatron.megatron_schedule(ranks, microbatches, 2, group)
    with pytest.raises(ScheduleError, match=">= 2 ranks"):
        megatron.megatron_schedule(1, 4)


def test_hooks_are_module_globals_restored_and_not_nested():
    from megatron.core.pipeline_parallel import schedules

    before = schedules.forward_step, schedules.backward_step
    with megatron.instrument_megatron(2, 0, Recorder()):
        assert schedules.forward_step is not before[0]
        with (
            pytest.raises(ConfigError, match="already active"),
            megatron.instrument_megatron(2, 0, Recorder()),
        ):
            pass
    assert (schedules.forward_step, schedules.backward_step) == before


def test_cuda_to_cpu_maps_device_argument():
    import torch

    with megatron.cuda_to_cpu():
        t = torch.zeros([], dtype=torch.int, device="cuda")
        u = torch.ones(2, device=torch.device("cuda", 0)).cuda()
    assert t.device.type == "cpu" and u.device.type == "cpu"


# --------------------------------------------------------------------------------------------
# Megatron's own schedule functions on gloo


class _Chunk(torch.nn.Module):
    """One model chunk as Megatron's schedules want it (config, model_type, set_input_tensor)."""

    def __init__(self, stage: int, hidden: int, config: Any, recorder: Recorder) -> None:
        from megatron.core.enums import ModelType

        super().__init__()
        self.lin = torch.nn.Linear(hidden, hidden)
        self.config, self.model_type = config, ModelType.encoder_or_decoder
        self.stage, self.recorder = stage, recorder
        self.input: Any = None

    def set_input_tensor(self, tensors: list[Any]) -> None:
        self.input = tensors[0]

    def forward(self, x: Any) -> Any:
        self.recorder.mark(f"{self.stage}F")
        return torch.tanh(self.lin(x if self.stage == 0 else self.input))


def _megatron_rank(rank: int, world: int, runs: list[tuple[int, int, int]]) -> dict[str, Any]:
    """Run Megatron's schedules (1F1B or interleaved per ``runs``) with a recording factory."""
    import torch.distributed as dist
    from megatron.core import parallel_state
    from megatron.core.pipeline_parallel import schedules
    from megatron.core.transformer import TransformerConfig

    dist.init_process_group("gloo", rank=rank, world_size=world)
    parallel_state.initialize_model_parallel(pipeline_model_parallel_size=world)
    hidden, seq, mbs = 8, 4, 2
    out: dict[str, Any] = {}
    for microbatches, chunks, group in runs:
        config = TransformerConfig(
            num_layers=world * chunks,
            hidden_size=hidden,
            num_attention_heads=1,
            pipeline_dtype=torch.float32,
            pipeline_model_parallel_size=world,
            virtual_pipeline_model_parallel_size=chunks if chunks > 1 else None,
            microbatch_group_size_per_vp_stage=group if chunks > 1 else None,
        )
        recorder = Recorder()

        torch.manual_seed(0)
        model = [_Chunk(c * world + rank, hidden, config, recorder) for c in range(chunks)]
        data = [torch.randn(seq, mbs, hidden) for _ in range(microbatches)]

        def forward_step(it: Any, chunk: Any) -> Any:
            y = chunk(next(it))
            return y, lambda o: ((o**2).mean(), {"loss": (o**2).mean().detach()})

        func = (
            schedules.forward_backward_pipelining_with_interleaving
            if chunks > 1
            else schedules.forward_backward_pipelining_without_interleaving
        )
        with (
            megatron.instrument_megatron(world, rank, recorder) as seen,
            megatron.cuda_to_cpu(),
        ):
            func(
                forward_step_func=forward_step,
                data_iterator=[iter(data) for _ in model] if chunks > 1 else iter(data),
                model=model if chunks > 1 else model[0],
                num_microbatches=microbatches,
                seq_length=seq,
                micro_batch_size=mbs,
                **megatron.cpu_communication(config),
            )
        out[f"{microbatches}x{chunks}x{group}"] = {
            "seen": [str(a) for a in seen],
            "events": recorder.events,
            "grads": [float(p.grad.abs().sum()) for c in model for p in c.parameters()],
        }
    return out


def test_megatron_runs_on_gloo_and_hooks_see_every_step_in_its_order():
    runs = [(4, 1, 0), (3, 1, 0), (4, 2, 2), (6, 2, 3)]
    results = run_ranks(2, _megatron_rank, runs)
    for microbatches, chunks, group in runs:
        expected = megatron.megatron_schedule(2, microbatches, chunks, group or None)
        for rank, result in enumerate(results):
            got = result[f"{microbatches}x{chunks}x{group}"]
            assert got["seen"] == [str(a) for a in expected.rank_actions[rank]]
            # Each action is entered, then computed (forwards), then exited, never nested.
            events = got["events"]
            enters = [e for e in events if e[0] == "enter"]
            assert [a for _, a in enters] == got["seen"]
            for i, (what, action) in enumerate(events):
                if what == "enter":
                    inner = events[i + 1]
                    if "F" in action:
                        assert inner == ("compute", action.split("F")[0] + "F")
                        inner = events[i + 2]
                    assert inner == ("exit", action)
            assert all(g > 0 for g in got["grads"])


def test_version_check_names_what_is_missing(monkeypatch):
    from megatron.core.pipeline_parallel import schedules

    monkeypatch.delattr(schedules, "get_schedule_table")
    with pytest.raises(ConfigError, match=r"lacks .*schedules\.get_schedule_table"):
        megatron.check_megatron_version()


def test_missing_megatron_is_an_install_hint(monkeypatch):
    import sys

    monkeypatch.setitem(sys.modules, "megatron.core", None)
    with pytest.raises(ConfigError, match=r"perseus-energy\[megatron\]"):
        megatron.check_megatron_version()


@pytest.mark.parametrize(
    ("ranks", "microbatches", "chunks", "builder"),
    [(2, 8, 1, "1f1b"), (4, 8, 2, "interleaved"), (2, 8, 2, None)],
)
def test_plans_from_perseus_frontier_fit_megatron(ranks, microbatches, chunks, builder):
    """Where the DAG equals a builder's, the job is the builder's, so `perseus frontier` plans
    fit; Megatron's other group sizes get a job of their own."""
    from perseus.io import load_profile
    from perseus.runtime.emulation import take_stages
    from perseus.runtime.planning import job_for_schedule

    group = None if builder is not None or chunks == 1 else 2 * ranks
    s = megatron.megatron_schedule(ranks, microbatches, chunks, group)
    job = job_for_schedule(s, take_stages(load_profile("a100"), ranks * chunks), 83.6)
    assert job.spec.schedule == (builder or "megatron-interleaved")


def megatron_1f1b(rank: int, world: int, microbatches: int) -> Callable[[bool], None]:
    """One stage per rank on gloo: ``run(forward_only)`` runs one Megatron 1F1B iteration (or
    a forward-only pass) over a tiny transformer chunk."""
    import torch.distributed as dist
    from megatron.core import parallel_state
    from megatron.core.pipeline_parallel import schedules
    from megatron.core.transformer import TransformerConfig

    dist.init_process_group("gloo", rank=rank, world_size=world)
    parallel_state.initialize_model_parallel(pipeline_model_parallel_size=world)
    hidden, seq, mbs = 8, 4, 2
    config = TransformerConfig(
        num_layers=world,
        hidden_size=hidden,
        num_attention_heads=1,
        pipeline_dtype=torch.float32,
        pipeline_model_parallel_size=world,
    )
    torch.manual_seed(0)
    model = _Chunk(rank, hidden, config, Recorder())
    data = [torch.randn(seq, mbs, hidden) for _ in range(microbatches)]

    def forward_step(it: Any, chunk: Any) -> Any:
        y = chunk(next(it))
        return y, lambda o: ((o**2).mean(), {"loss": (o**2).mean().detach()})

    def run(forward_only: bool) -> None:
        schedules.forward_backward_pipelining_without_interleaving(
            forward_step_func=forward_step,
            data_iterator=iter(data),
            model=model,
            num_microbatches=microbatches,
            seq_length=seq,
            micro_batch_size=mbs,
            forward_only=forward_only,
            **megatron.cpu_communication(config),
        )

    return run


def _megatron_session_rank(rank: int, world: int, microbatches: int) -> dict[str, Any]:
    """Megatron's 1F1B under RankSession(MegatronEngine), a forward_only=True pass between
    iterations, on the README's simulated GPU."""
    from perseus.device.simulated import SimulatedGPU
    from perseus.io import default_blocking_power_w, load_profile
    from perseus.runtime.emulation import scale_profile, take_stages
    from perseus.runtime.session import RankSession, SessionOptions

    run = megatron_1f1b(rank, world, microbatches)
    bundled = load_profile("a100")
    power = default_blocking_power_w(bundled)
    assert power is not None
    profile = scale_profile(take_stages(bundled, world), 0.25)
    gpu = SimulatedGPU.from_profile(profile, blocking_power_w=power)
    engine = megatron.MegatronEngine(world, rank, microbatches)
    session = RankSession(
        engine, gpu=gpu, plan=profile, options=SessionOptions(blocking_power_w=power)
    )
    with session, megatron.cuda_to_cpu():
        for i in range(3):
            with session.iteration():
                run(forward_only=False)
            if i == 0:
                run(forward_only=True)  # validation between iterations
    return {"iterations": len(session.history), "step_call": engine.step_call}


@pytest.mark.slow
def test_forward_only_between_iterations_runs_untouched():
    results = run_ranks(2, _megatron_session_rank, 4)
    for r in results:
        assert r["iterations"] == 3
        assert r["step_call"] == "forward_backward_func(...)"


def test_engine_adapter_keeps_no_action_per_op(monkeypatch):
    """MegatronEngine.attach lives for the whole run: its hooks must not keep every action run
    (the session keeps its own bounded records); a direct instrument_megatron still lists them."""
    import contextlib

    from megatron.core.pipeline_parallel import schedules

    monkeypatch.setattr(schedules, "forward_step", lambda *a, **k: (torch.zeros(1), 0))
    monkeypatch.setattr(schedules, "backward_step", lambda *a, **k: None)
    kept: list[list[Any]] = []
    real = megatron.instrument_megatron

    @contextlib.contextmanager
    def spy(*args: Any, **kwargs: Any):
        with real(*args, **kwargs) as seen:
            kept.append(seen)
            yield seen

    monkeypatch.setattr(megatron, "instrument_megatron", spy)
    recorder = Recorder()
    undo = megatron.MegatronEngine(2, 0, 4).attach(recorder, lambda: True)
    try:
        for _ in range(50):  # iterations
            for k in range(4):
                out, _ = schedules.forward_step(current_microbatch=k)
                schedules.backward_step(None, out, None)
    finally:
        undo()
    assert len(recorder.events) == 2 * 400  # every op ran inside the factory
    assert kept == [[]]
    with real(2, 0, Recorder()) as seen:
        out, _ = schedules.forward_step(current_microbatch=0)
        schedules.backward_step(None, out, None)
    assert [str(a) for a in seen] == ["0F0", "0B0"]
