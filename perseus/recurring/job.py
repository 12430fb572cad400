"""Use from a training loop: ``with job.run() as run:`` picks the batch size and power limit.

Each run is decided and claimed in one store transaction, sets its batch size's cached power
limit or profiles it, measures GPU energy and time and records the result at exit
(docs/recurring.md shows the loop, preemption and the pipeline-parallel composition). The
limit goes back to the default at exit, on a signal that ends the process, and by the
watchdog or the next owner if the process is killed.
"""

from __future__ import annotations

import contextlib
import logging
import math
import threading
from collections.abc import Iterator, Sequence
from typing import Any

import numpy as np

from perseus.device.base import GPU, ManagedGPU, PowerLimitGPU
from perseus.device.clock import REAL_CLOCK, Clock
from perseus.errors import ConfigError, DeviceError, PerseusError
from perseus.io._signal_cleanup import SignalCleanup
from perseus.recurring.cost import check_eta, zeus_cost
from perseus.recurring.policy import BatchSizeOptimizer, Decision, Observation
from perseus.recurring.profiler import PowerLimitProfiler
from perseus.recurring.store import RecurringStore

__all__ = ["RecurringJob", "RecurringRun"]

log = logging.getLogger(__name__)


class RecurringRun:
    """One run of a recurring job (made by :meth:`RecurringJob.run`)."""

    def __init__(
        self,
        job: RecurringJob,
        run_id: str,
        decision: Decision,
        profiler: PowerLimitProfiler | None,
        power_limit_w: float | None,
        ended: threading.Event,
    ) -> None:
        self.job, self.run_id, self.decision = job, run_id, decision
        #: Set when a signal ended the process under the run: nothing more is recorded.
        self.ended = ended
        self._profiler, self._power_limit_w = profiler, power_limit_w
        self.epochs, self.reached, self.stopped_early = 0, False, False
        self._t0 = self._last_beat = job.clock.now()
        self._e0_mj = job.gpu.energy_mj()
        self._last_epoch_cost = 0.0

    @property
    def batch_size(self) -> int:
        return self.decision.batch_size

    @property
    def power_limit_w(self) -> float | None:
        """The limit in force: the cached or profiled one (None while profiling/uncontrolled)."""
        if self._profiler is not None:
            return self._profiler.chosen_w
        return self._power_limit_w

    @property
    def profiling(self) -> bool:
        return self._profiler is not None and not self._profiler.done

    def energy_j(self) -> float:
        return (self.job.gpu.energy_mj() - self._e0_mj) / 1000.0

    def time_s(self) -> float:
        return self.job.clock.now() - self._t0

    def cost(self) -> float:
        return zeus_cost(self.energy_j(), self.time_s(), self.job.eta, self.job.max_power_w)

    def step(self, samples: int = 1) -> None:
        """Report one finished training iteration of ``samples`` samples (renews the lease)."""
        if self._profiler is not None and not self._profiler.done:
            self._profiler.step(samples)
            if self._profiler.done and not self.ended.is_set():
                try:
                    self.job._save_profile(self.batch_size, self._profiler)
                except PerseusError as e:  # a busy or full store must not stop the training
                    log.warning(
                        "run %s: the power-limit profile of batch size %d is not cached (%s); "
                        "the next run of that size profiles again",
                        self.run_id,
                        self.batch_size,
                        e,
                    )
        self._heartbeat()

    def _heartbeat(self, force: bool = False) -> None:
        """Renew the lease with the figures so far (at most every ``heartbeat_interval_s``
        unless ``force``)."""
        now = self.job.clock.now()
        if not force and now - self._last_beat < self.job.heartbeat_interval_s:
            return
        self._last_beat = now
        try:
            if not self.job.store.heartbeat(self.run_id, self.observation()):
                log.warning("run %s: the store no longer holds it as running", self.run_id)
        except PerseusError as e:  # a busy or full store must not stop the training
            log.warning("run %s: lease not renewed: %s", self.run_id, e)

    def end_epoch(self, *, reached: bool) -> bool:
        """Report the end of an epoch (``reached``: the metric reached the job's target);
        True when the loop should stop."""
        self.epochs += 1
        cost = self.cost()
        epoch_cost = cost - self._last_epoch_cost
        self._last_epoch_cost = cost
        self._heartbeat(force=True)
        if reached:
            self.reached = True
            return True
        limit = self.decision.cost_limit
        if limit is not None and cost + epoch_cost > limit:
            self.stopped_early = True
            log.info("run %s: cost %.4g would pass %.4g: stopping early", self.run_id, cost, limit)
            return True
        return self.job.max_epochs is not None and self.epochs >= self.job.max_epochs

    def observation(self) -> Observation:
        limit = self.power_limit_w
        return Observation(
            batch_size=self.batch_size,
            power_limit_w=float(limit) if limit is not None else float("nan"),
            energy_j=self.energy_j(),
            time_s=self.time_s(),
            cost=self.cost(),
            reached=self.reached,
            epochs=self.epochs,
        )


class RecurringJob:
    """A job that is re-run again and again; each run gets a batch size and a power limit.

    The constructor does no I/O.

    Args:
        name: The job's name in the store (one history per name).
        batch_sizes: Allowed batch sizes; ``default_batch_size`` is ``b0``.
        store: Where the history lives (a :class:`~perseus.recurring.store.RecurringStore`:
            SQLite or PostgreSQL, :func:`~perseus.recurring.database.open_store`).
        gpu: The GPU (energy counter; power limit if it implements ``PowerLimitGPU``).
        eta: Energy-time weight η ∈ [0, 1]; ``beta`` the early-stopping factor β.
        max_power_w: ``MAXPOWER`` of the cost (default: the GPU's highest power limit).
        max_epochs: Epoch budget; a run out of epochs failed (None: the loop decides).
        seed: Seed of the Thompson sampler (None: fresh entropy).
        profiler_kwargs: Passed to :class:`PowerLimitProfiler` (steps, window, limits).
        own_gpu: Hold the GPU's ownership lock for the run. False: an agent of this process
            holds it; the job still starts a watchdog and records that a reset is due.
        clock: What run times are measured on (the simulated GPU's clock in emulation).
        heartbeat_interval_s: Least time between two renewals of the run's lease by
            :meth:`RecurringRun.step` (each epoch's end renews it regardless; keep it well
            under the store's ``lease_s``).
    """

    def __init__(
        self,
        name: str,
        *,
        batch_sizes: Sequence[int],
        default_batch_size: int,
        store: RecurringStore,
        gpu: GPU,
        eta: float = 0.5,
        beta: float = 2.0,
        max_power_w: float | None = None,
        max_epochs: int | None = None,
        seed: int | None = None,
        profiler_kwargs: dict[str, Any] | None = None,
        own_gpu: bool = True,
        clock: Clock = REAL_CLOCK,
        heartbeat_interval_s: float = 60.0,
    ) -> None:
        if not name:
            raise ConfigError("a recurring job needs a non-empty name")
        if not (math.isfinite(heartbeat_interval_s) and heartbeat_interval_s >= 0):
            raise ConfigError(
                f"heartbeat_interval_s must be a finite number >= 0, got {heartbeat_interval_s!r}"
            )
        self.heartbeat_interval_s = heartbeat_interval_s
        self.name = name
        self.policy = BatchSizeOptimizer(batch_sizes, default_batch_size, beta=beta)
        self.store = store
        self.gpu = gpu
        self.eta = check_eta(eta)
        self._max_power_w = max_power_w
        self.max_epochs = max_epochs
        self._rng = np.random.default_rng(seed)
        self.profiler_kwargs = dict(profiler_kwargs or {})
        self.own_gpu = own_gpu
        self.clock = clock

    @property
    def max_power_w(self) -> float:
        if self._max_power_w is None:
            if not isinstance(self.gpu, PowerLimitGPU):
                raise ConfigError(
                    f"job {self.name!r}: the GPU has no power-limit range; pass max_power_w"
                )
            self._max_power_w = self.gpu.power_limit_range_w()[1]
        return self._max_power_w

    def _config(self) -> dict[str, Any]:
        return {
            "batch_sizes": list(self.policy.batch_sizes),
            "default_batch_size": self.policy.default_batch_size,
            "eta": self.eta,
            "beta": self.policy.beta,
            "max_power_w": self.max_power_w,
        }

    def _decide(self, history: Sequence[Observation], pending: Sequence[int]) -> Decision:
        return self.policy.decide(history, self._rng, pending=pending)

    def _save_profile(self, batch_size: int, profiler: PowerLimitProfiler) -> None:
        assert profiler.chosen_w is not None  # called when done
        if not profiler.measurements:
            log.warning(
                "job %s: the power-limit profile of batch size %d measured no energy (a GPU "
                "energy counter that does not advance?); not cached, the next run profiles again",
                self.name,
                batch_size,
            )
            return
        profile = {
            str(w): {"samples_per_s": m.samples_per_s, "avg_power_w": m.avg_power_w}
            for w, m in profiler.measurements.items()
        }
        stored = self.store.save_power_limit_w(
            self.name, self.gpu.name, batch_size, profiler.chosen_w, profile
        )
        if stored != profiler.chosen_w and isinstance(self.gpu, PowerLimitGPU):
            self.gpu.set_power_limit_w(stored)  # a concurrent run profiled first: follow it
            profiler.chosen_w = stored

    @contextlib.contextmanager
    def _guard(self, ended: threading.Event) -> Iterator[None]:
        """Reset the power limit to the default on exit and on signals; for a
        :class:`~perseus.device.base.ManagedGPU`, also when this process is killed (the
        agent's :class:`~perseus.runtime.safety.guard.GpuClaim`: its watchdog and the next
        owner reset it; without ``own_gpu`` the claim records the reset but holds no lock)."""
        gpu = self.gpu
        if not isinstance(gpu, PowerLimitGPU):
            yield
            return
        from perseus.runtime.safety.guard import ExitGuard, GpuClaim

        def reset() -> None:
            with contextlib.suppress(DeviceError):
                gpu.reset_power_limit()

        def on_exit() -> None:  # the process is ending (exit hooks; a signal that ends it)
            ended.set()
            reset()

        if isinstance(gpu, ManagedGPU):
            claim = GpuClaim(
                gpu, watchdog=True, handle_signals=True, on_exit=on_exit, hold_lock=self.own_gpu
            )
            release = claim.acquire().release
        else:  # nothing to hand a watchdog: exit hooks only
            guard = ExitGuard(on_exit)
            guard.install()
            release = guard.uninstall
        try:
            yield
        finally:
            try:
                reset()
            finally:
                release()

    @contextlib.contextmanager
    def _lease(self, run_id: str, ended: threading.Event) -> Iterator[None]:
        """A SIGTERM/SIGHUP that ends the process marks the run abandoned first (the handler
        installed before runs first and decides; never swallowed)."""
        from perseus.runtime.safety.guard import ExitGuard

        def abandon() -> None:
            ended.set()
            self.store.abandon_run(run_id, "signal", urgent=True)

        guard = ExitGuard(abandon, signals=SignalCleanup.SIGNALS)
        guard.install()
        try:
            yield
        finally:
            guard.uninstall()

    def _abandon(self, run_id: str, reason: str) -> None:
        try:
            self.store.abandon_run(run_id, reason)
        except PerseusError as e:  # the original error matters more; the lease covers it
            log.warning("run %s: could not mark it abandoned: %s", run_id, e)

    @contextlib.contextmanager
    def run(self) -> Iterator[RecurringRun]:
        """One run: decide, set or profile the power limit, measure, record.

        Raises:
            ConfigError: the store holds this job with another configuration, or a row it
                cannot use (named, with how to repair or drop it).
        """
        self.store.register_job(self.name, self._config())
        started = self.store.begin_run(self.name, self._decide)
        run_id, bs = started.run_id, started.decision.batch_size
        handed_over = False
        ended = threading.Event()
        try:
            with self._lease(run_id, ended), self._guard(ended):
                profiler = None
                limit: float | None = None
                if isinstance(self.gpu, PowerLimitGPU):
                    limit = self.store.cached_power_limit_w(
                        self.name, self.gpu.name, bs, range_w=self.gpu.power_limit_range_w()
                    )
                    if limit is not None:
                        self.gpu.set_power_limit_w(limit)
                    else:
                        profiler = PowerLimitProfiler(
                            self.gpu,
                            eta=self.eta,
                            max_power_w=self.max_power_w,
                            clock=self.clock,
                            **self.profiler_kwargs,
                        )
                run = RecurringRun(self, run_id, started.decision, profiler, limit, ended)
                shown = "profiling" if profiler is not None else limit
                phase = started.decision.phase
                log.info(
                    "job %s run %s: batch size %d (%s), power limit %s",
                    self.name,
                    run_id,
                    bs,
                    phase,
                    shown,
                )
                handed_over = True
                yield run
                o = run.observation()
        except BaseException:
            # the training code failed (or the run could not start), not the batch size
            self._abandon(run_id, "exception" if handed_over else "not started")
            raise
        if ended.is_set():  # a signal ended the process under the run: a preemption
            self._abandon(run_id, "signal")
            return
        if not (o.energy_j > 0 and o.time_s > 0):
            log.warning(
                "run %s: %g J in %g s is no measurement (a GPU energy counter that does not "
                "advance?); not recorded",
                run_id,
                o.energy_j,
                o.time_s,
            )
            self._abandon(run_id, "unmeasured")
            return
        try:
            self.store.finish_run(run_id, o)
        except BaseException:
            self._abandon(run_id, "exception")
            raise
