"""Straggler-aware plan switching at run time, the same decision on every rank of a pipeline.

In data-parallel training the pipelines meet at the gradient all-reduce, so when one pipeline
is slowed (thermal throttling, a slow node) the others can run a slower, cheaper plan for free.
This module feeds :class:`perseus.runtime.straggler.policy.StragglerPolicy` at every iteration
boundary:

* **Detection.** Each rank measures its compute-bound iteration time (window start to the end
  of its last action, *not* the wait at the data-parallel sync), scaled to its fastest plan
  (:meth:`StragglerRuntime.intrinsic_time_s`). One all-reduce (MAX) over all
  ranks of a vector with one slot per pipeline gives every rank every pipeline's time; the
  pipeline's time is its slowest rank's. Every rank therefore holds the same numbers at the
  same boundary and derives the same decision: no rank ever runs a different plan from its
  pipeline peers, without any extra coordination.
* **External hints.** A cluster monitor (or a person) can declare "pipeline k is slowed to T′"
  through the job's torch.distributed store (``perseus straggler set --store HOST:PORT
  --pipeline K --time-s T``), e.g. before a known throttle starts. Only global rank 0 reads the
  store; its reading travels in the same all-reduce, so all ranks see the same hint. Rank 0
  acknowledges each new hint (and each clearing) in the store with the iteration it read it
  at, so the command can say whether a running job took it.
* **Switching.** The decision is returned to :class:`perseus.runtime.pipeline.PerseusPipeline`
  as a boundary hook and takes effect from the next iteration on.
"""

from __future__ import annotations

import math
import secrets
from dataclasses import dataclass
from typing import Any

from perseus.errors import ConfigError
from perseus.plan import Frontier
from perseus.runtime.collectives import all_reduce_max, global_rank
from perseus.runtime.straggler.policy import StragglerPolicy

__all__ = [
    "ACK_PREFIX",
    "CLEARED",
    "HINT_PREFIX",
    "StragglerDecision",
    "StragglerRuntime",
    "ack_key",
    "clear_hint",
    "hint_key",
    "raw_store",
    "read_ack",
    "read_hint",
    "read_hint_entry",
    "set_hint",
]

#: Store key prefix of external straggler hints: ``perseus/straggler/<pipeline>``.
HINT_PREFIX = "perseus/straggler/"
#: Store key prefix of the job's acknowledgements: ``perseus/straggler/ack/<pipeline>``.
ACK_PREFIX = HINT_PREFIX + "ack/"
#: The acknowledgement of a cleared hint names this instead of a token.
CLEARED = "-"


def hint_key(pipeline_index: int) -> str:
    """The store key holding pipeline ``pipeline_index``'s declared iteration time."""
    return f"{HINT_PREFIX}{pipeline_index}"


def ack_key(pipeline_index: int) -> str:
    """The store key where the running job acknowledges pipeline ``pipeline_index``'s hint:
    ``"<token> <iteration>"`` (the hint's token, or ``-`` once a hint was cleared)."""
    return f"{ACK_PREFIX}{pipeline_index}"


def raw_store(store: Any) -> Any:
    """The store under any ``PrefixStore`` wrappers (what an outside client connects to)."""
    while hasattr(store, "underlying_store"):
        store = store.underlying_store
    return store


def set_hint(store: Any, pipeline_index: int, time_s: float) -> str:
    """Declare that pipeline ``pipeline_index`` runs at ``time_s`` per iteration.

    The value is ``"<time_s> <token>"``; the job acknowledges the token (:func:`read_ack`)
    when global rank 0 reads it at an iteration boundary.

    Returns:
        The hint's token.

    Raises:
        ConfigError: if ``time_s`` is not positive or the index is negative.
    """
    if pipeline_index < 0 or not (math.isfinite(time_s) and time_s > 0):
        raise ConfigError(
            f"`pipeline_index` must be >= 0 and `time_s` > 0, got {pipeline_index} and {time_s}"
        )
    token = secrets.token_hex(6)
    store.set(hint_key(pipeline_index), f"{float(time_s)!r} {token}")
    return token


def clear_hint(store: Any, pipeline_index: int) -> None:
    """Remove pipeline ``pipeline_index``'s hint (no error if there is none)."""
    key = hint_key(pipeline_index)
    if store.check([key]):
        store.delete_key(key)


def _read(store: Any, key: str) -> str | None:
    """The text under ``key``, or None when there is none or it is not UTF-8 (never blocks)."""
    if not store.check([key]):
        return None
    try:
        return str(store.get(key).decode())
    except UnicodeDecodeError:
        return None


def read_hint_entry(store: Any, pipeline_index: int) -> tuple[float, str] | None:
    """Pipeline ``pipeline_index``'s declared time and token (``""`` for a value written
    without one), or None (never blocks)."""
    fields = (_read(store, hint_key(pipeline_index)) or "").split()
    try:
        value = float(fields[0])
    except (ValueError, IndexError):
        return None
    if not (math.isfinite(value) and value > 0):
        return None
    return value, (fields[1] if len(fields) > 1 else "")


def read_hint(store: Any, pipeline_index: int) -> float | None:
    """The declared time of pipeline ``pipeline_index``, or None (never blocks)."""
    entry = read_hint_entry(store, pipeline_index)
    return None if entry is None else entry[0]


def read_ack(store: Any, pipeline_index: int) -> tuple[str, int | None] | None:
    """The job's last acknowledgement for pipeline ``pipeline_index``: the token it read
    (:data:`CLEARED` after a clear) and the iteration (None if unknown), or None if no job
    ever acknowledged one."""
    text = _read(store, ack_key(pipeline_index))
    if text is None:
        return None
    token, _, iteration = text.partition(" ")
    return token, int(iteration) if iteration.isdecimal() else None


@dataclass(frozen=True, slots=True)
class StragglerDecision:
    """One boundary's decision on one rank.

    Attributes:
        iteration: The iteration that just ended.
        pipeline_times_s: Every pipeline's time (measured, raised to its hint if any).
        straggler: Index of the slowest pipeline.
        point_index: The plan this pipeline runs next.
        reason: The policy's reason (``"fastest"``, ``"slack"``, ``"straggler"``, ...).
    """

    iteration: int
    pipeline_times_s: tuple[float, ...]
    straggler: int
    point_index: int
    reason: str


class StragglerRuntime:
    """Boundary hook that switches this pipeline's plan when another pipeline straggles.

    Args:
        frontier: This pipeline's frontier (all pipelines run the same job).
        pipeline_index: This rank's data-parallel replica (pipeline) index.
        num_pipelines: Data-parallel degree D.
        group: Process group spanning all pipelines (default: the world).
        store: Store to read hints from (read on global rank 0 only); None disables hints.
        adaptive: False measures and records but never switches (the baseline).
        hysteresis, smoothing: :class:`StragglerPolicy` parameters.

    Raises:
        ConfigError: for an index outside ``0..num_pipelines-1``.
    """

    def __init__(
        self,
        frontier: Frontier,
        *,
        pipeline_index: int,
        num_pipelines: int,
        group: Any = None,
        store: Any = None,
        adaptive: bool = True,
        hysteresis: float = 0.01,
        smoothing: float = 1.0,
    ) -> None:
        if not 0 <= pipeline_index < num_pipelines:
            raise ConfigError(f"pipeline index {pipeline_index} is outside 0..{num_pipelines - 1}")
        self.frontier = frontier
        self.pipeline_index = pipeline_index
        self.num_pipelines = num_pipelines
        self.group = group
        self.store = raw_store(store) if store is not None else None
        self.adaptive = adaptive
        self.policy = StragglerPolicy(frontier, hysteresis=hysteresis, smoothing=smoothing)
        self.decisions: list[StragglerDecision] = []
        self.point_index = 0
        self._acked: dict[int, str | None] = {}  # pipeline -> token last acknowledged

    def exchange(self, compute_time_s: float, iteration: int | None = None) -> tuple[float, ...]:
        """All-reduce (MAX) this rank's compute time and rank 0's hints; every pipeline's time.

        Global rank 0 acknowledges each hint it reads for the first time (and each clearing of
        one) under :func:`ack_key`, with ``iteration``, so that ``perseus straggler set`` can
        tell a job that read the hint from a store nobody reads.

        Works on gloo and NCCL-only groups alike (:func:`perseus.runtime.collectives.all_reduce_max`
        puts the buffer on the device the group's backend needs).
        """
        d = self.num_pipelines
        values = [0.0] * (2 * d)
        values[self.pipeline_index] = float(compute_time_s)
        if self.store is not None and global_rank() == 0:
            for k in range(d):
                entry = read_hint_entry(self.store, k)
                if entry is not None:
                    values[d + k] = entry[0]
                self._acknowledge(k, entry[1] if entry is not None else None, iteration)
        reduced = all_reduce_max(values, self.group)
        return tuple(max(reduced[k], reduced[d + k]) for k in range(d))

    def _acknowledge(self, k: int, token: str | None, iteration: int | None) -> None:
        """Tell the store that this job read pipeline ``k``'s hint (or its clearing), once."""
        if token == self._acked.get(k) or (token is None and k not in self._acked):
            return
        self._acked[k] = token
        assert self.store is not None
        when = str(iteration) if iteration is not None else "?"
        self.store.set(ack_key(k), f"{token if token is not None else CLEARED} {when}")

    def decide(self, iteration: int, times_s: tuple[float, ...]) -> StragglerDecision:
        """The policy's choice for this pipeline given every pipeline's time (pure)."""
        slowest = max(range(len(times_s)), key=lambda k: (times_s[k], -k))
        me = self.pipeline_index
        if self.adaptive:
            choice = self.policy.decide(times_s[slowest], is_straggler=slowest == me)
            self.point_index, reason = choice.point_index, str(choice.reason)
        else:
            reason = "fixed"
        decision = StragglerDecision(iteration, times_s, slowest, self.point_index, reason)
        self.decisions.append(decision)
        return decision

    def intrinsic_time_s(self, compute_time_s: float) -> float:
        """This pipeline's measured time, scaled to what its fastest plan would take.

        A pipeline that slowed down *by choice* (a cheaper plan) must not look like a
        straggler, or the pipelines would take turns: each slows to just under the other's
        time, then looks slowest itself. Scaling by ``T_fastest / T_plan`` (both predicted)
        leaves only the slowdown the plan does not explain.
        """
        points = self.frontier.points
        return compute_time_s * points[0].time_s / points[self.point_index].time_s

    def __call__(self, stats: Any) -> tuple[Frontier, int] | None:
        """The :data:`perseus.runtime.session.BoundaryHook` interface. ``stats`` may be of the
        iteration before the one that just ended (a real GPU's figures come one iteration late):
        every pipeline's ranks exchange the same iteration's figures, and the decision applies
        from the next iteration to start."""
        if stats.phase != "run":
            return None
        times = self.exchange(self.intrinsic_time_s(stats.compute_time_s), stats.iteration)
        decision = self.decide(stats.iteration, times)
        return (self.frontier, decision.point_index) if self.adaptive else None
