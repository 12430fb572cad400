"""Adapter for Megatron-Core's pipeline schedules (no fork, no edit of Megatron's files).

The only module that touches Megatron-Core names that are not documented API, checked once
by :func:`check_megatron_version`. The schedule is rebuilt from Megatron's own
``get_pp_rank_microbatches`` and ``get_schedule_table``; model chunk ``c`` of rank ``r`` is
stage ``c * R + r``. :func:`cpu_communication` and :func:`cuda_to_cpu` run Megatron on CPUs
for emulation, never on a GPU.
"""

from __future__ import annotations

import functools
import sys
import types
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

from perseus.errors import ConfigError, ScheduleError
from perseus.runtime.engines.base import (
    OpContextFactory,
    attach_hooks,
    check_engine_version,
    refuse_eval,
)
from perseus.schedule.actions import Action, Kind, Schedule
from perseus.schedule.builders import schedule_from_actions

__all__ = [
    "MIN_MEGATRON_VERSION",
    "TESTED_VERSIONS",
    "MegatronEngine",
    "check_megatron_version",
    "cpu_communication",
    "cuda_to_cpu",
    "instrument_megatron",
    "megatron_schedule",
]

#: Oldest megatron-core whose pipeline internals this adapter was written against.
MIN_MEGATRON_VERSION = (0, 16)
#: The versions the ``megatron`` extra allows (tested: 0.16.1).
TESTED_VERSIONS = ">=0.16.1,<0.17"

#: The schedule functions a user calls (``get_forward_backward_func()`` returns one of them).
_FORWARD_BACKWARD_NAMES = (
    "forward_backward_no_pipelining",
    "forward_backward_pipelining_without_interleaving",
    "forward_backward_pipelining_with_interleaving",
)
_SCHEDULE_NAMES = (
    "forward_step",
    "backward_step",
    "get_schedule_table",
    "get_pp_rank_microbatches",
    *_FORWARD_BACKWARD_NAMES,
)
_P2P_NAMES = ("P2PCommunicator._communicate", "_p2p_ops")


def check_megatron_version() -> types.SimpleNamespace:
    """Import Megatron-Core's pipeline modules (``schedules``, ``p2p`` of the result),
    checking every name this adapter uses.

    Raises:
        ConfigError: megatron-core is missing, older than :data:`MIN_MEGATRON_VERSION`, or
            lacks a name.
    """
    schedules, p2p = check_engine_version(
        "megatron.core",
        MIN_MEGATRON_VERSION,
        f"pip install 'perseus-energy[megatron]'  # megatron-core{TESTED_VERSIONS}",
        (
            "megatron.core.pipeline_parallel.schedules",
            "megatron.core.pipeline_parallel.p2p_communication",
        ),
        [(0, n) for n in _SCHEDULE_NAMES] + [(1, n) for n in _P2P_NAMES],
        TESTED_VERSIONS,
    )
    return types.SimpleNamespace(schedules=schedules, p2p=p2p)


def megatron_schedule(
    num_ranks: int,
    num_microbatches: int,
    virtual_stages: int = 1,
    microbatch_group_size_per_vp_stage: int | None = None,
) -> Schedule:
    """The compute actions Megatron-Core's pipeline schedule runs: ``megatron-1f1b``, or
    ``megatron-interleaved`` with ``virtual_stages`` model chunks per rank.

    Args:
        virtual_stages: Model chunks per rank (1: ``..._without_interleaving``).
        microbatch_group_size_per_vp_stage: Megatron's config field (default: ``num_ranks``).

    Raises:
        ScheduleError: for sizes Megatron refuses (its own rules, with its reason).

    Complexity: O(R · V · M).
    """
    mc = check_megatron_version()
    R, M, V = num_ranks, num_microbatches, virtual_stages
    if R < 2 or M < 1 or V < 1:
        raise ScheduleError(
            f"Megatron pipelining needs >= 2 ranks, >= 1 microbatch and >= 1 model chunk per "
            f"rank; got {R} ranks, {M} microbatches, {V} chunks"
        )
    group = R if microbatch_group_size_per_vp_stage is None else microbatch_group_size_per_vp_stage
    table = _schedule_table(mc, R, M, V, group)
    rank_actions = []
    for r in range(R):
        # A stand-in process group: only the size and rank Megatron's helpers ask for.
        pp_group = types.SimpleNamespace(size=lambda: R, rank=lambda r=r: r)
        comm = types.SimpleNamespace(
            pp_group=pp_group, virtual_pipeline_model_parallel_size=V if V > 1 else None
        )
        total, _, warmup, remaining = mc.schedules.get_pp_rank_microbatches(
            M, V, group, forward_only=False, p2p_communicator=comm
        )
        next_b = [0] * V

        def fwd(k: int, r: int = r) -> Action:
            m, c = table[k]
            return Action(c * R + r, Kind.F, m)

        def bwd(k: int, r: int = r, next_b: list[int] = next_b) -> Action:
            c = V - 1 - table[k][1]
            m = next_b[c]  # Megatron pops each chunk's oldest stored forward (FIFO)
            next_b[c] += 1
            return Action(c * R + r, Kind.B, m)

        acts = [fwd(k) for k in range(warmup)]
        for k in range(remaining):
            acts += [fwd(k + warmup), bwd(k)]
        acts += [bwd(k) for k in range(remaining, total)]
        rank_actions.append(acts)
    name = "megatron-interleaved" if V > 1 else "megatron-1f1b"
    stage_to_rank = tuple(s % R for s in range(R * V))
    return schedule_from_actions(name, rank_actions, R * V, M, stage_to_rank)


def _schedule_table(
    mc: types.SimpleNamespace, R: int, M: int, V: int, group: int
) -> list[tuple[int, int]]:
    """Megatron's (microbatch, chunk) order of forward steps, after the checks of Megatron's
    ``forward_backward_pipelining_with_interleaving``."""
    if V == 1:
        return [(m, 0) for m in range(M)]
    if not R <= group <= M:
        raise ScheduleError(
            f"Megatron's interleaved schedule needs microbatch_group_size_per_vp_stage "
            f"({group}) between the pipeline size ({R}) and the microbatches ({M})"
        )
    tail = M % group
    if 0 < tail < R:
        raise ScheduleError(
            f"Megatron's interleaved schedule needs microbatches ({M}) % group size "
            f"({group}) to be 0 or >= the pipeline size ({R}); it is {tail}"
        )
    return [(int(m), int(c)) for m, c in mc.schedules.get_schedule_table(M, V, group)]


_installed: list[bool] = []  # guards against nesting (the hooks are module globals)


def _forward_action(kwargs: dict[str, Any], num_ranks: int, rank: int) -> Action:
    if kwargs.get("current_microbatch") is None:
        raise ScheduleError("Megatron's forward_step was called without current_microbatch")
    chunk = kwargs.get("vp_stage") or 0
    return Action(int(chunk) * num_ranks + rank, Kind.F, int(kwargs["current_microbatch"]))


@contextmanager
def instrument_megatron(
    num_ranks: int,
    rank: int,
    factory: OpContextFactory,
    in_iteration: Callable[[], bool] = lambda: False,
    *,
    record: bool = True,
) -> Iterator[list[Action]]:
    """Run every forward/backward step of Megatron's pipeline schedules inside ``factory``.

    The module globals ``forward_step`` and ``backward_step``, and the ``forward_backward_*``
    schedule functions, are wrappers for the block's duration. The forward's action comes from
    its ``current_microbatch`` and ``vp_stage``, the backward's from the output tensor its
    forward returned. Evaluation (``forward_only=True`` or no gradients) is not instrumented,
    and is refused inside a training iteration.

    Yields:
        The actions run so far, appended as they run (none kept when not ``record``).

    Raises:
        ConfigError: if the hooks are already installed in this process; from an evaluation
            pass inside a training iteration.
    """
    schedules = check_megatron_version().schedules
    if _installed:
        raise ConfigError("instrument_megatron is already active in this process")
    original_fwd, original_bwd = schedules.forward_step, schedules.backward_step
    seen: list[Action] = []
    note: Callable[[Action], None] = seen.append if record else (lambda _: None)
    pending: dict[int, tuple[Any, Action]] = {}  # id(output) -> (output kept alive, forward)

    @functools.wraps(original_fwd)
    def forward_step(*args: Any, **kwargs: Any) -> Any:
        # refused here too: a schedule function taken before the hooks does not refuse
        if _refuse_eval(in_iteration, _calling_forward_only(schedules)):
            return original_fwd(*args, **kwargs)
        action = _forward_action(kwargs, num_ranks, rank)
        if action.microbatch_index == 0 and action.stage_index == rank:
            pending.clear()  # a new iteration: drop what an aborted one left behind
        note(action)
        with factory(action):
            result = original_fwd(*args, **kwargs)
        output = result[0]
        pending[id(output)] = (output, action)
        return result

    @functools.wraps(original_bwd)
    def backward_step(
        input_tensor: Any, output_tensor: Any, output_tensor_grad: Any, *args: Any, **kw: Any
    ) -> Any:
        entry = pending.pop(id(output_tensor), None)
        if entry is None:
            return original_bwd(input_tensor, output_tensor, output_tensor_grad, *args, **kw)
        fwd = entry[1]
        action = Action(fwd.stage_index, Kind.B, fwd.microbatch_index)
        note(action)
        with factory(action):
            return original_bwd(input_tensor, output_tensor, output_tensor_grad, *args, **kw)

    hooks = {
        n: _refusing_eval(getattr(schedules, n), in_iteration) for n in _FORWARD_BACKWARD_NAMES
    }
    hooks |= {"forward_step": forward_step, "backward_step": backward_step}
    originals = {name: getattr(schedules, name) for name in hooks}
    _installed.append(True)
    vars(schedules).update(hooks)
    try:
        yield seen
    finally:
        vars(schedules).update(originals)
        _installed.clear()


def _refuse_eval(in_iteration: Callable[[], bool], forward_only: bool) -> bool:
    """Whether this is an evaluation pass (``forward_only`` or no gradients); refused inside a
    training iteration."""
    import torch

    if not (forward_only or not torch.is_grad_enabled()):
        return False
    flag = "forward_only=True" if forward_only else "under torch.no_grad()"
    refuse_eval(in_iteration, f"forward_backward_func(..., {flag})")
    return True


def _refusing_eval(original: Any, in_iteration: Callable[[], bool]) -> Any:
    """A schedule function that refuses evaluation inside an iteration before it communicates."""

    @functools.wraps(original)
    def run(*args: Any, **kwargs: Any) -> Any:
        _refuse_eval(in_iteration, bool(kwargs.get("forward_only")))
        return original(*args, **kwargs)

    return run


def _calling_forward_only(schedules: types.ModuleType) -> bool:
    """The ``forward_only`` argument of the schedule function that called ``forward_step``
    (found on the stack: a forward step does not receive it; a few frames up at most)."""
    frame: types.FrameType | None = sys._getframe(2)
    for _ in range(8):
        if frame is None:
            break
        if frame.f_globals is vars(schedules) and frame.f_code.co_name in _FORWARD_BACKWARD_NAMES:
            return bool(frame.f_locals.get("forward_only", False))
        frame = frame.f_back
    return False


class MegatronEngine:
    """The engine adapter for Megatron-Core's pipeline schedules (see :mod:`.base`).

    Args:
        num_ranks, num_microbatches, virtual_stages, microbatch_group_size_per_vp_stage: As
            :func:`megatron_schedule`.
        group: The pipeline's process group (default: the default group).

    Raises:
        ConfigError: a rank out of range; ScheduleError: see :func:`megatron_schedule`.
    """

    step_call = "forward_backward_func(...)"
    schedule: Schedule
    rank: int
    group: Any

    def __init__(
        self,
        num_ranks: int,
        rank: int,
        num_microbatches: int,
        virtual_stages: int = 1,
        microbatch_group_size_per_vp_stage: int | None = None,
        group: Any = None,
    ) -> None:
        if not 0 <= rank < num_ranks:
            raise ConfigError(f"pipeline rank {rank} is out of range for {num_ranks} ranks")
        self.schedule = megatron_schedule(
            num_ranks, num_microbatches, virtual_stages, microbatch_group_size_per_vp_stage
        )
        self.rank = rank
        self.group = group

    def attach(self, op: OpContextFactory, in_iteration: Callable[[], bool]) -> Callable[[], None]:
        """Install :func:`instrument_megatron` until the returned undo is called."""
        return attach_hooks(
            # Nothing kept per op: the session keeps its own (bounded) records.
            instrument_megatron(self.schedule.num_ranks, self.rank, op, in_iteration, record=False)
        )


@functools.cache
def _cpu_communicator_class(base: type, p2p: types.ModuleType) -> type:
    """Megatron's ``P2PCommunicator`` with CPU receive buffers (gloo), Megatron's own ops."""

    class CpuP2PCommunicator(base):  # type: ignore[misc]
        def _communicate(
            self,
            *,
            tensor_send_next: Any,
            tensor_send_prev: Any,
            recv_prev: bool,
            recv_next: bool,
            tensor_shape: Any,
            wait_on_reqs: bool = True,
        ) -> tuple[Any, Any, Any]:
            import torch

            config = self.config
            if config.variable_seq_lengths:
                raise ConfigError(
                    "perseus's CPU emulation of Megatron needs fixed sequence lengths "
                    "(variable_seq_lengths=False)"
                )

            def buffer(wanted: bool) -> Any:
                if not wanted:
                    return None
                if tensor_shape is None or config.pipeline_dtype is None:
                    raise ConfigError("Megatron needs tensor_shape and pipeline_dtype to receive")
                return torch.empty(
                    tensor_shape, requires_grad=True, device="cpu", dtype=config.pipeline_dtype
                )

            recv_prev_t, recv_next_t = buffer(recv_prev), buffer(recv_next)
            # Individual ops whatever batch_p2p_comm says: batched ones on gloo aborted ranks.
            reqs = p2p._p2p_ops(
                tensor_send_prev=tensor_send_prev,
                tensor_recv_prev=recv_prev_t,
                tensor_send_next=tensor_send_next,
                tensor_recv_next=recv_next_t,
                group=self.pp_group,
                prev_pipeline_rank=self.prev_rank,
                next_pipeline_rank=self.next_rank,
            )
            if wait_on_reqs and reqs:
                for req in reqs.values():
                    req.wait()
                reqs = None
            return recv_prev_t, recv_next_t, reqs

    return CpuP2PCommunicator


def cpu_communication(config: Any) -> dict[str, Any]:
    """``p2p_communicator=`` and ``pg_collection=`` arguments of Megatron's
    ``forward_backward_*`` functions for running on CPU (gloo), after
    ``parallel_state.initialize_model_parallel``; ``config``: the model's ``TransformerConfig``.
    """
    mc = check_megatron_version()
    from megatron.core import parallel_state
    from megatron.core.process_groups_config import ProcessGroupCollection

    pp_group = parallel_state.get_pipeline_model_parallel_group()
    cls = _cpu_communicator_class(mc.p2p.P2PCommunicator, mc.p2p)
    pgs = ProcessGroupCollection()
    pgs.tp = parallel_state.get_tensor_model_parallel_group()
    pgs.cp = parallel_state.get_context_parallel_group()
    pgs.pp = pp_group
    pgs.embd = parallel_state.get_embedding_group(check_initialized=False)
    pgs.pos_embd = parallel_state.get_position_embedding_group(check_initialized=False)
    pgs.dp_cp = parallel_state.get_data_parallel_group(
        with_context_parallel=True, partial_data_parallel=False
    )
    return {"p2p_communicator": cls(pp_group=pp_group, config=config), "pg_collection": pgs}


@contextmanager
def cuda_to_cpu() -> Iterator[None]:
    """Map ``device="cuda"`` (and ``Tensor.cuda()``) to the CPU for torch calls in the block:
    emulation only (Megatron's schedules allocate a counter on a literal ``device="cuda"``)."""
    import torch
    from torch.overrides import TorchFunctionMode

    class _CudaToCpu(TorchFunctionMode):
        def __torch_function__(
            self,
            func: Callable[..., Any],
            types: Any,
            args: tuple[Any, ...] = (),
            kwargs: dict[str, Any] | None = None,
        ) -> Any:
            kwargs = dict(kwargs or {})
            device = kwargs.get("device")  # "cuda:0" or torch.device("cuda", 0)
            if str(getattr(device, "type", device)).startswith("cuda"):
                kwargs["device"] = "cpu"
            if func is torch.Tensor.cuda:
                return args[0]
            return func(*args, **kwargs)

    with _CudaToCpu():
        yield
