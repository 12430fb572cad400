"""Straggler-aware plan switching at run time (``docs/straggler.md``): at every iteration
boundary :class:`StragglerRuntime` exchanges every pipeline's time and global rank 0's store
hints (``perseus straggler set``) in one all-reduce (MAX), so every rank derives the same plan.
"""

from __future__ import annotations

import math
import secrets
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from perseus.errors import ConfigError
from perseus.plan import Frontier
from perseus.runtime.collectives import all_reduce_max, global_rank
from perseus.runtime.straggler.policy import StragglerPolicy

__all__ = [
    "ACK_PREFIX",
    "CLEARED",
    "DECISIONS_KEPT",
    "HINTS_VERSION_KEY",
    "HINT_PREFIX",
    "StragglerDecision",
    "StragglerRuntime",
    "ack_key",
    "clear_hint",
    "clear_key",
    "hint_key",
    "raw_store",
    "read_ack",
    "read_ack_at",
    "read_hint",
    "read_hint_entry",
    "read_text",
    "set_hint",
    "write_ack",
]

#: Store key prefix of external straggler hints: ``perseus/straggler/<pipeline>``.
HINT_PREFIX = "perseus/straggler/"
#: Store key prefix of the job's acknowledgements: ``perseus/straggler/ack/<pipeline>``.
ACK_PREFIX = HINT_PREFIX + "ack/"
#: Counts the changes :func:`set_hint` and :func:`clear_hint` make: the job reads the hints
#: again only when it moved (one store round trip per boundary, not two per pipeline).
HINTS_VERSION_KEY = HINT_PREFIX + "version"
#: The acknowledgement of a cleared hint names this instead of a token.
CLEARED = "-"
#: How many of the latest decisions a runtime keeps (a run of weeks makes one per iteration).
DECISIONS_KEPT = 10_000


def hint_key(pipeline_index: int) -> str:
    """The store key of pipeline ``pipeline_index``'s declared iteration time."""
    return f"{HINT_PREFIX}{pipeline_index}"


def ack_key(pipeline_index: int) -> str:
    """The store key where the job acknowledges pipeline ``pipeline_index``'s hint."""
    return f"{ACK_PREFIX}{pipeline_index}"


def raw_store(store: Any) -> Any:
    """The store under any ``PrefixStore`` wrappers (what an outside client connects to)."""
    while hasattr(store, "underlying_store"):
        store = store.underlying_store
    return store


def set_hint(store: Any, pipeline_index: int, time_s: float) -> str:
    """Declare that pipeline ``pipeline_index`` runs at ``time_s`` per iteration; returns the
    token the job acknowledges (:func:`read_ack`).

    Raises:
        ConfigError: if ``time_s`` is not positive or the index is negative.
    """
    if pipeline_index < 0 or not (math.isfinite(time_s) and time_s > 0):
        raise ConfigError(
            f"`pipeline_index` must be >= 0 and `time_s` > 0, got {pipeline_index} and {time_s}"
        )
    token = secrets.token_hex(6)
    store.set(hint_key(pipeline_index), f"{float(time_s)!r} {token}")
    store.add(HINTS_VERSION_KEY, 1)
    return token


def clear_hint(store: Any, pipeline_index: int) -> None:
    """Remove pipeline ``pipeline_index``'s hint (no error if there is none)."""
    clear_key(store, hint_key(pipeline_index))
    store.add(HINTS_VERSION_KEY, 1)


def clear_key(store: Any, key: str) -> None:
    """Empty ``key`` if it holds a value. Never deleted: a job between ``check`` and ``get``
    (:func:`read_text`) would then wait for the key until the store's timeout."""
    if store.check([key]):
        store.set(key, "")


def read_text(store: Any, key: str) -> str | None:
    """The text under ``key``, or None when there is none or it is not UTF-8 (never blocks: a
    key once written is never deleted, see :func:`clear_key`)."""
    if not store.check([key]):
        return None
    try:
        return str(store.get(key).decode())
    except UnicodeDecodeError:
        return None


def read_ack_at(store: Any, key: str) -> tuple[str, int | None] | None:
    """The acknowledgement under ``key``: the token read (:data:`CLEARED` after a clearing) and
    the iteration (None if unknown), or None if no job acknowledged one."""
    text = read_text(store, key)
    if text is None:
        return None
    token, _, iteration = text.partition(" ")
    return token, int(iteration) if iteration.isdecimal() else None


def write_ack(store: Any, key: str, token: str | None, iteration: int | None) -> None:
    """Acknowledge under ``key`` that the job read ``token`` (None: a clearing) at ``iteration``."""
    when = str(iteration) if iteration is not None else "?"
    store.set(key, f"{token if token is not None else CLEARED} {when}")


def read_hint_entry(store: Any, pipeline_index: int) -> tuple[float, str] | None:
    """Pipeline ``pipeline_index``'s declared time and token (``""``: none), or None."""
    fields = (read_text(store, hint_key(pipeline_index)) or "").split()
    try:
        value = float(fields[0])
    except (ValueError, IndexError):
        return None
    if not (math.isfinite(value) and value > 0):
        return None
    return value, (fields[1] if len(fields) > 1 else "")


def read_hint(store: Any, pipeline_index: int) -> float | None:
    """The declared time of pipeline ``pipeline_index``, or None."""
    entry = read_hint_entry(store, pipeline_index)
    return None if entry is None else entry[0]


def read_ack(store: Any, pipeline_index: int) -> tuple[str, int | None] | None:
    """The job's last acknowledgement for pipeline ``pipeline_index`` (:func:`read_ack_at`)."""
    return read_ack_at(store, ack_key(pipeline_index))


@dataclass(frozen=True, slots=True)
class StragglerDecision:
    """One boundary's decision on one rank.

    Attributes:
        iteration: The iteration that just ended.
        pipeline_times_s: Every pipeline's intrinsic time
            (:meth:`StragglerRuntime.intrinsic_time_s`), raised to its hint if any.
        straggler: Index of the slowest pipeline.
        point_index: The plan this pipeline runs next.
        reason: The policy's reason, or ``"fixed"`` when not adaptive.
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
        pipeline_index: This rank's pipeline (data-parallel replica) index.
        num_pipelines: Data-parallel degree.
        group: Process group spanning all pipelines (default: the world).
        store: Store to read hints from (on global rank 0); None disables hints.
        adaptive: False measures and records but never switches (the baseline).
        hysteresis, smoothing: :class:`StragglerPolicy` parameters.

    Attributes:
        decisions: The latest :data:`DECISIONS_KEPT` decisions, oldest first.
        next_iteration: The session's next iteration to start, set when the hook is added
            (None: the stats' iteration + 1): a hint read at a boundary is acknowledged at the
            iteration before it, the one that ended (a real GPU's stats are one older).

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
        self.decisions: deque[StragglerDecision] = deque(maxlen=DECISIONS_KEPT)
        self.point_index = 0
        self._acked: dict[int, str | None] = {}  # pipeline -> token last acknowledged
        self._hints: list[float] = [0.0] * num_pipelines  # as read at `_version` (0: none)
        self._version: int | None = None
        self.next_iteration: Callable[[], int] | None = None

    def exchange(self, compute_time_s: float, iteration: int | None = None) -> tuple[float, ...]:
        """Every pipeline's time: this rank's compute time and rank 0's hints, all-reduced
        (MAX); rank 0 acknowledges each new hint or clearing with ``iteration``."""
        d = self.num_pipelines
        values = [0.0] * (2 * d)
        values[self.pipeline_index] = float(compute_time_s)
        if self.store is not None and global_rank() == 0:
            values[d:] = self._read_hints(self.store, iteration)
        reduced = all_reduce_max(values, self.group)
        return tuple(max(reduced[k], reduced[d + k]) for k in range(d))

    def _read_hints(self, store: Any, iteration: int | None) -> list[float]:
        """Every pipeline's hint (0.0: none), read again when :data:`HINTS_VERSION_KEY` moved;
        each new hint or clearing acknowledged with ``iteration``."""
        version = int(store.add(HINTS_VERSION_KEY, 0))
        if version != self._version:  # read before the hints: a change while reading moves it
            self._version = version
            for k in range(self.num_pipelines):
                entry = read_hint_entry(store, k)
                self._hints[k], token = entry if entry is not None else (0.0, None)
                if token != self._acked.get(k):  # None: never acknowledged, or cleared
                    self._acked[k] = token
                    write_ack(store, ack_key(k), token, iteration)
        return self._hints

    def decide(self, iteration: int, times_s: tuple[float, ...]) -> StragglerDecision:
        """The policy's choice for this pipeline given every pipeline's time (pure)."""
        slowest = max(range(len(times_s)), key=lambda k: (times_s[k], -k))
        me = self.pipeline_index
        if self.adaptive:
            # T′ in this pipeline's frontier time: a pipeline itself slowed (a second straggler,
            # or every time above the frontier's) must finish its plan within T′ as it runs.
            own, fastest = times_s[me], self.frontier.points[0].time_s
            t_prime = times_s[slowest] * (fastest / own if own > fastest else 1.0)
            choice = self.policy.decide(t_prime, is_straggler=slowest == me)
            self.point_index, reason = choice.point_index, str(choice.reason)
        else:
            reason = "fixed"
        decision = StragglerDecision(iteration, times_s, slowest, self.point_index, reason)
        self.decisions.append(decision)
        return decision

    def follow_frontier(self, frontier: Frontier) -> None:
        """Decide on ``frontier`` from now on, from its fastest plan with no history: a
        session calls it with each plan it makes from its own (re-)profile, whose points
        this runtime's frontier no longer describes."""
        policy = self.policy
        self.frontier = frontier
        self.policy = StragglerPolicy(
            frontier, hysteresis=policy.hysteresis, smoothing=policy.smoothing
        )
        self.point_index = 0

    def intrinsic_time_s(self, compute_time_s: float, point_index: int | None = None) -> float:
        """This pipeline's measured time scaled by ``T_fastest / T_plan``: a pipeline slowed by
        choice (a cheaper plan) must not look like a straggler, or pipelines take turns.
        ``point_index``: the plan the time was measured on (default: the last decided)."""
        points = self.frontier.points
        ran = self.point_index if point_index is None else point_index
        return compute_time_s * points[0].time_s / points[ran].time_s

    def __call__(self, stats: Any) -> tuple[Frontier, int] | None:
        """The :data:`perseus.runtime.session.BoundaryHook` interface."""
        if stats.phase != "run":
            return None
        # Scaled by the plan the iteration ran: one decided a boundary earlier (figures one
        # iteration late) or by another hook, not the last decided here.
        ran = stats.point_index
        if ran is None or not 0 <= ran < len(self.frontier.points):
            ran = None
        intrinsic_s = self.intrinsic_time_s(stats.compute_time_s, ran)
        upcoming = stats.iteration + 1 if self.next_iteration is None else self.next_iteration()
        times = self.exchange(intrinsic_s, upcoming - 1)  # in force from `upcoming` on
        decision = self.decide(stats.iteration, times)
        return (self.frontier, decision.point_index) if self.adaptive else None
