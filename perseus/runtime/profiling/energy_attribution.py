"""Per-op power from energy-counter windows and the ops' device-time spans (docs/timing.md).

With ``d[k, g]`` op group ``g``'s device time in counter window ``k``, ``gap`` the time inside
an iteration covered by no op and ``outside`` the rest, :func:`fit_group_power` solves

    E_k = sum_g p_g d[k, g] + p_gap d[k, gap] + p_out d[k, outside]

for ``p >= 0`` with a light ridge: groups the windows cannot tell apart are pulled to their
common mean, and with ``idle_power_w`` the non-op columns lightly towards it.
"""

from __future__ import annotations

import math
from collections.abc import Hashable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from perseus.errors import ConfigError
from perseus.runtime.profiling.energy_windows import CounterInterval, CounterSampler

__all__ = ["DEFAULT_RIDGE", "OpSpan", "PowerFit", "SweepWindow", "fit_group_power", "time_shares"]


#: The default ridge: it moves a group's power ~(ridge/share)^2 towards the others' (0.01
#: moved a forward row 2.5 %, 0.002 about 0.1 %) and still decides groups nothing separates.
DEFAULT_RIDGE = 0.002
#: The non-op columns' pull towards the blocking power, relative to the ridge. Light: a firm
#: pull moves a counter's gain error (0.95 on an A100) into the ops next to the bubbles.
_GAP_PRIOR = _OUTSIDE_PRIOR = 1.0
#: :func:`fit_group_power`'s default ``outlier_w``.
_OUTLIER_W = 5.0


@dataclass(frozen=True, slots=True)
class OpSpan:
    """One op on the device timeline: its group (e.g. ``(stage_index, kind)``) and iteration."""

    group: Hashable
    start_s: float
    end_s: float
    iteration: int = 0


@dataclass(frozen=True, slots=True)
class PowerFit:
    """Fitted mean power per op group and of the non-op time.

    Attributes:
        power_w: Per op group.
        gap_power_w: Inside iterations, no op running (bubbles, P2P waits).
        outside_power_w: Between iterations.
        intervals: Counter windows used.
        residual_w: RMS over windows of (measured - fitted energy) / window length.
        power_se_w: Standard error of each op group's power (large for windows that disagree
            or a group they cannot tell from the others).
    """

    power_w: dict[Hashable, float]
    gap_power_w: float
    outside_power_w: float
    intervals: int
    residual_w: float
    power_se_w: dict[Hashable, float] = field(default_factory=dict)

    def relative_error(self, group: Hashable) -> float:
        """Two standard errors of ``group``'s power over the power (inf when unknown)."""
        power = self.power_w.get(group, 0.0)
        se = self.power_se_w.get(group)
        if se is None or not power > 0:
            return math.inf
        return 2.0 * se / power

    def worst_relative_error(self) -> float:
        """The largest :meth:`relative_error` over the op groups."""
        return max((self.relative_error(g) for g in self.power_w), default=math.inf)


def _overlaps(
    a: np.ndarray, b: np.ndarray, s: np.ndarray, e: np.ndarray, disjoint: bool
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The positive overlaps of windows ``[a, b)`` and spans ``[s, e)``: window rows, span
    columns and seconds (``disjoint``: windows in time order and disjoint, found by binary
    search)."""
    if disjoint:
        first = np.searchsorted(b, s, side="right")  # the first window ending after the start
        stop = np.searchsorted(a, e, side="left")  # past the last one starting before the end
        counts = np.clip(stop - first, 0, None)
        cols = np.repeat(np.arange(s.size), counts)
        offsets = np.arange(cols.size) - np.repeat(np.cumsum(counts) - counts, counts)
        rows = np.repeat(first, counts) + offsets
    else:
        rows, cols = (x.ravel() for x in np.indices((a.size, s.size)))
    seconds = np.minimum(b[rows], e[cols]) - np.maximum(a[rows], s[cols])
    keep = seconds > 0
    return rows[keep], cols[keep], seconds[keep]


def time_shares(
    intervals: Sequence[CounterInterval], spans: Sequence[OpSpan]
) -> tuple[list[Hashable], np.ndarray]:
    """The groups (first-seen order) and the matrix of device time per window (rows) and
    column (each group, then ``gap``, then ``outside``), in seconds. O((windows + spans) log
    windows + overlaps) for windows in time order and disjoint (a sampler's), else
    O(windows x spans)."""
    groups = list(dict.fromkeys(s.group for s in spans))
    col = {g: j for j, g in enumerate(groups)}
    n_groups = len(groups)
    a = np.asarray([w.start_s for w in intervals], dtype=float)
    b = np.asarray([w.end_s for w in intervals], dtype=float)
    disjoint = bool(np.all(a <= b) and np.all(b[:-1] <= a[1:]))
    shares = np.zeros((len(intervals), n_groups + 2))
    if spans:
        s = np.asarray([x.start_s for x in spans], dtype=float)
        e = np.asarray([x.end_s for x in spans], dtype=float)
        rows, cols, seconds = _overlaps(a, b, s, e, disjoint)
        group_col = np.asarray([col[x.group] for x in spans], dtype=np.intp)
        np.add.at(shares, (rows, group_col[cols]), seconds)
        # Iteration envelopes: first op start to last op end.
        bounds: dict[int, list[float]] = {}
        for x in spans:
            lo_hi = bounds.setdefault(x.iteration, [x.start_s, x.end_s])
            lo_hi[0] = min(lo_hi[0], x.start_s)
            lo_hi[1] = max(lo_hi[1], x.end_s)
        env = np.asarray(list(bounds.values()), dtype=float)
        rows, _, seconds = _overlaps(a, b, env[:, 0], env[:, 1], disjoint)
        inside = np.bincount(rows, weights=seconds, minlength=len(intervals))
        busy = shares[:, :n_groups].sum(axis=1)
        shares[:, n_groups] = np.clip(inside - busy, 0.0, None)
    length = b - a
    shares[:, n_groups + 1] = np.clip(length - shares[:, : n_groups + 1].sum(axis=1), 0.0, None)
    return groups, shares


def _inside(shares: np.ndarray) -> np.ndarray:
    """Per window (a :func:`time_shares` row): True when none of it lies between iterations."""
    inside: np.ndarray = shares[:, -1] <= 1e-6 * np.maximum(shares.sum(axis=1), 1e-12)
    return inside


def fit_group_power(
    intervals: Sequence[CounterInterval],
    spans: Sequence[OpSpan],
    *,
    idle_power_w: float | None = None,
    ridge: float = DEFAULT_RIDGE,
    outlier_w: float = _OUTLIER_W,
    known_shares: tuple[list[Hashable], np.ndarray] | None = None,
) -> PowerFit:
    """Fit each op group's mean power to the counter windows (see the module docstring).

    Windows far out are down-weighted (Huber weights, iterated), and those over ``outlier_w``
    and five robust standard deviations dropped for a final fit while enough remain.

    Args:
        intervals: Counter windows (inside the spans' time range).
        idle_power_w: Prior for the non-op columns (the nominal blocking power), or None.
        ridge: Regularisation weight (0: plain non-negative least squares).
        outlier_w: Residual power (W) below which no window counts as an outlier.
        known_shares: :func:`time_shares` of these windows and spans, if already computed.

    Raises:
        ConfigError: without windows or spans, or for a negative ridge.

    Complexity: :func:`time_shares`, then NNLS on (windows + groups + 2) rows and groups + 2
    columns, 8 times.
    """
    if not intervals or not spans:
        raise ConfigError("fit_group_power needs at least one counter window and one op span")
    if ridge < 0:
        raise ConfigError(f"ridge must be >= 0, got {ridge}")
    groups, shares = time_shares(intervals, spans) if known_shares is None else known_shares
    energy = np.asarray([w.energy_j for w in intervals], dtype=float)
    lengths = shares.sum(axis=1)
    n = len(groups)
    inside = _inside(shares)
    if int(inside.sum()) >= 2 * (n + 2) and not inside.all():
        # Only windows wholly inside iterations: what runs between them (optimizer, a stalled
        # host) trades energy with the ops (seen: a step's op energy 25 % low).
        shares, energy, lengths = shares[inside], energy[inside], lengths[inside]
    per_w = np.where(lengths > 0, lengths, 1.0)
    power = _solve(shares, energy, n, idle_power_w, ridge)
    for _ in range(6):
        resid = (energy - shares @ power) / per_w
        scale = max(outlier_w, 2.0 * 1.4826 * float(np.median(np.abs(resid))))
        weight = 1.0 / np.maximum(1.0, np.abs(resid) / scale)
        root = np.sqrt(weight)[:, None]
        power = _solve(shares * root, energy * root[:, 0], n, idle_power_w, ridge)
    resid = (energy - shares @ power) / per_w
    sigma = 1.4826 * float(np.median(np.abs(resid)))
    keep = np.abs(resid) <= max(outlier_w, 5.0 * sigma)
    if int(keep.sum()) >= n + 2:
        power = _solve(shares[keep], energy[keep], n, idle_power_w, ridge)
        resid = (energy[keep] - shares[keep] @ power) / per_w[keep]
    else:
        keep = np.ones(len(energy), dtype=bool)
    se = _standard_errors(shares[keep], energy[keep], power, n, idle_power_w, ridge)
    return PowerFit(
        power_w={g: float(power[j]) for j, g in enumerate(groups)},
        gap_power_w=float(power[n]),
        outside_power_w=float(power[n + 1]),
        intervals=int(keep.sum()),
        residual_w=float(np.sqrt(np.mean(resid**2))),
        power_se_w={g: float(se[j]) for j, g in enumerate(groups)},
    )


def _standard_errors(
    shares: np.ndarray,
    energy: np.ndarray,
    power: np.ndarray,
    n: int,
    idle_power_w: float | None,
    ridge: float,
) -> np.ndarray:
    """Standard errors of the op groups' powers: residual variance x diag((A^T A)^-1), the
    ridge and prior rows included in ``A``."""
    a, _, used = _design(shares, energy, n, idle_power_w, ridge)
    dof = len(energy) - int(used.sum())
    if dof < 1:
        return np.full(n, math.inf)
    resid = energy - shares @ power
    s2 = float(resid @ resid) / dof
    try:
        inv = np.linalg.inv(a.T @ a)
    except np.linalg.LinAlgError:
        return np.full(n, math.inf)
    diag = np.full(n + 2, math.inf)
    diag[used] = np.sqrt(np.clip(np.diag(inv), 0.0, None) * s2)
    return diag[:n]


def _design(
    shares: np.ndarray, energy: np.ndarray, n: int, idle_power_w: float | None, ridge: float
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The least-squares matrix (the windows, then the ridge rows; only the columns with time
    in some window: the others are unknowable), its right-hand side and those columns."""
    rows, rhs = [shares], [energy]
    if ridge > 0:
        weight = ridge * math.sqrt(float(np.sum(shares.sum(axis=1) ** 2)))
        if n > 1:
            pull = np.zeros((n, n + 2))
            pull[:, :n] = np.eye(n) - 1.0 / n
            rows.append(weight * pull)
            rhs.append(np.zeros(n))
        if idle_power_w is not None:
            prior = np.zeros((2, n + 2))
            prior[0, n], prior[1, n + 1] = _GAP_PRIOR * weight, _OUTSIDE_PRIOR * weight
            rows.append(prior)
            rhs.append(prior.sum(axis=1) * idle_power_w)
    used = shares.sum(axis=0) > 0
    return np.vstack(rows)[:, used], np.concatenate(rhs), used


def _solve(
    shares: np.ndarray, energy: np.ndarray, n: int, idle_power_w: float | None, ridge: float
) -> np.ndarray:
    """NNLS on :func:`_design`'s rows; a non-op column no window covers takes ``idle_power_w``."""
    from scipy.optimize import nnls

    a, rhs, used = _design(shares, energy, n, idle_power_w, ridge)
    power = np.zeros(n + 2)
    if a.shape[1]:
        power[used] = nnls(a, rhs, maxiter=50 * (n + 2))[0]
    if idle_power_w is not None:
        power[n : n + 2][~used[n:]] = idle_power_w
    return power


@dataclass
class SweepWindow:
    """One sweep step's ops, and whether the counter windows over them are enough to fit.

    A step is ready when the windows inside its device-time span number at least
    ``min_intervals`` and twice the unknowns (op groups + 2), after ``max_iterations``
    iterations, or at once when no window can come (reads fail, or 50 iterations without one).

    Args:
        min_intervals: Windows wanted per step (20, ~2 s on NVML, kept every emulated A100
            row within ~2 %; 10 left some 10-17 % off).
        max_iterations: Give up waiting for windows after this many iterations of one step.
        idle_power_w: Prior for the non-op power (see :func:`fit_group_power`).
        ridge: See :func:`fit_group_power`.
        max_fit_error: A step whose :meth:`PowerFit.worst_relative_error` exceeds this runs
            more iterations, up to ``max_iterations``.
    """

    sampler: CounterSampler
    min_intervals: int = 20
    max_iterations: int = 200
    idle_power_w: float | None = None
    ridge: float = DEFAULT_RIDGE
    max_fit_error: float = 0.02
    spans: list[OpSpan] = field(default_factory=list)
    iterations: int = 0
    # The fit ready() judged, and the step it judged (see fit()).
    _judged: tuple[tuple[Any, ...], PowerFit] | None = field(
        default=None, init=False, repr=False, compare=False
    )

    def __post_init__(self) -> None:
        if self.min_intervals < 1 or self.max_iterations < 1:
            raise ConfigError(
                f"min_intervals and max_iterations must be >= 1, got {self.min_intervals}, "
                f"{self.max_iterations}"
            )

    def add_iteration(self, spans: Sequence[OpSpan]) -> None:
        """Add one iteration's ops (all at this step's clocks)."""
        self._judged = None
        self.spans.extend(OpSpan(s.group, s.start_s, s.end_s, self.iterations) for s in spans)
        self.iterations += 1

    def span_s(self) -> tuple[float, float] | None:
        """The step's device-time span: first op start to last op end."""
        if not self.spans:
            return None
        return min(s.start_s for s in self.spans), max(s.end_s for s in self.spans)

    def intervals(self) -> list[CounterInterval]:
        """The counter windows wholly inside the step's span."""
        span = self.span_s()
        return [] if span is None else self.sampler.intervals(*span)

    def needed(self) -> int:
        """Windows wanted before fitting."""
        groups = len({s.group for s in self.spans})
        return max(self.min_intervals, 2 * (groups + 2))

    def ready(self) -> bool:
        """True when the step has enough windows (or waited ``max_iterations``)."""
        self._judged = None
        if not self.spans:
            return False
        if self.iterations >= self.max_iterations:
            return True
        intervals = self.intervals()
        windows = len(intervals)
        if not windows and (
            self.iterations >= 50 or (self.sampler.errors and not self.sampler.samples())
        ):
            return True  # no counter to wait for (reads fail, or it never moves): fit nothing
        needed = self.needed()
        if windows < needed:
            return False
        # Enough windows inside iterations, or (iterations too short to hold any) twice as many.
        shared = time_shares(intervals, self.spans)
        if windows < 2 * needed and int(_inside(shared[1]).sum()) < needed:
            return False
        # One fit per call, on the shares just computed (the step's spans grow); fit() reuses it.
        fit = fit_group_power(
            intervals,
            self.spans,
            idle_power_w=self.idle_power_w,
            ridge=self.ridge,
            known_shares=shared,
        )
        self._judged = (self._fit_key(), fit)
        return fit.worst_relative_error() <= self.max_fit_error

    def _fit_key(self) -> tuple[Any, ...]:
        return (id(self.spans), len(self.spans), self.idle_power_w, self.ridge)

    def fit(self) -> PowerFit | None:
        """Fit the step's powers; None when no window lies inside the step. Right after
        :meth:`ready` judged a fit (no op added since), that fit."""
        judged = self._judged
        if judged is not None and judged[0] == self._fit_key():
            return judged[1]
        windows = self.intervals()
        if not windows or not self.spans:
            return None
        return fit_group_power(
            windows, self.spans, idle_power_w=self.idle_power_w, ridge=self.ridge
        )

    def reset(self) -> None:
        """Start the next step (or restart this one after a failed iteration)."""
        span = self.span_s()
        if span is not None:  # a second of history locates the next step's first publish
            self.sampler.discard_before(span[1] - 1.0)
        self.spans = []
        self.iterations = 0
        self._judged = None
