"""A running job as a fleet member: the fleet's plan is one more source of a power cap.

:class:`FleetMember` registers the job's frontier and serves the keys
:mod:`perseus.runtime.power.cap` reads (pass it as the session's ``power_store``): the plan's
cap per pipeline and the acknowledgement of when it took effect. Each read renews the lease.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence

from perseus.device.clock import WALL_CLOCK, Clock
from perseus.errors import ConfigError, PerseusError
from perseus.fleet.registry import Assignment, FleetRegistry
from perseus.plan import Frontier
from perseus.runtime.power.cap import ACK_KEY, CAP_KEY
from perseus.solver.fleet import fleet_job

__all__ = ["FleetMember"]

log = logging.getLogger(__name__)

#: A cap a hair above the planned point's power, so float noise never moves the job below it.
_CAP_SLACK = 1e-9
#: After the database failed to answer, the last plan is served this long (at most a quarter
#: of the lease) before the next try: a server out of reach costs no iteration a timeout.
_RETRY_S = 5.0


class FleetMember:
    """A job of the fleet, read like a torch store by the job's power runtime.

    Args:
        url: The fleet's database; ``name`` the job's (unique) name in it.
        frontier: The deployed frontier (its power curve is registered).
        weight: The value of one unit of the job's progress.
        gpus: The job's GPUs (a multiple of the frontier's ranks; default: the ranks).
        lease_s: The job loses its share this long after its last read; a started member
            that reads again after that registers again (its share comes with the next plan;
            meanwhile, its lowest-power plan).
        clock: The wall clock (tests inject one).
    """

    def __init__(
        self,
        url: str,
        name: str,
        frontier: Frontier,
        *,
        weight: float = 1.0,
        gpus: int | None = None,
        lease_s: float = 60.0,
        clock: Clock = WALL_CLOCK,
    ) -> None:
        self.job = fleet_job(name, frontier, weight=weight, gpus=gpus)
        self.name = name
        self.replicas = (gpus or frontier.job.ranks) // frontier.job.ranks
        self.lease_s = lease_s
        self.registry = FleetRegistry(url, clock=clock)
        self.assignment: Assignment | None = None
        self._ack = b""
        self._started = False
        self._clock = clock
        #: While the database fails to answer: when to ask it again (None: it answers).
        self._retry_at: float | None = None
        #: When the database last answered; a lease past since then may be expired, and
        #: the plan's power the others': the job then runs its lowest-power plan.
        self._answered_s = clock.now()
        self._lapsed = False

    def start(self) -> FleetMember:
        """Register (or re-register) the job; its first plan comes with the next re-solve, and
        until then it runs its lowest-power plan."""
        self.registry.register(self.job, lease_s=self.lease_s)
        self._started, self._answered_s = True, self._clock.now()
        return self

    def close(self) -> None:
        """The job is done: its power goes back to the others."""
        self._started = False
        try:
            self.registry.finish(self.name)
        except ConfigError:
            raise
        except PerseusError as e:  # the training is done: its lease runs out instead
            log.warning(
                "fleet member %s: finished, but the fleet's database does not answer (%s); its "
                "share goes back to the others when its lease runs out",
                self.name,
                e,
            )
        finally:
            self.registry.close()

    def __enter__(self) -> FleetMember:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()

    # The store interface of perseus.runtime.power.cap

    def check(self, keys: Sequence[str]) -> bool:
        if CAP_KEY in keys:
            if self._retry_at is None or self._clock.now() >= self._retry_at:
                self._read_plan()
            return self.assignment is not None or self._started
        return ACK_KEY in keys and bool(self._ack)

    def _read_plan(self) -> None:
        """Renew the lease and read the plan. A database that does not answer (busy, down,
        out of reach) or, once the job runs, holds rows perseus cannot use (edited by hand,
        grants revoked) must not stop the training: the last plan holds meanwhile."""
        try:
            if not self.registry.heartbeat(self.name) and self._started:
                # The planner expired the lease of this live job (a pause longer than the
                # lease): join again, or it runs uncapped on power planned for the others.
                log.warning(
                    "fleet member %s: its lease ran out while it ran; registering again",
                    self.name,
                )
                self.registry.register(self.job, lease_s=self.lease_s)
            self.assignment = self.registry.assignment(self.name)
        except PerseusError as e:
            if isinstance(e, ConfigError) and not self._started:
                raise
            if self._retry_at is None:
                log.warning(
                    "fleet member %s: the fleet's database does not answer (%s); the last plan "
                    "holds until it does (past the lease, the lowest-power plan)",
                    self.name,
                    e,
                )
            now = self._clock.now()
            self._retry_at = now + min(_RETRY_S, self.lease_s / 4)
            self._lapsed = now - self._answered_s > self.lease_s
            return
        self._answered_s, self._lapsed = self._clock.now(), False
        if self._retry_at is not None:
            log.info("fleet member %s: the fleet's database answers again", self.name)
            self._retry_at = None

    def get(self, key: str) -> bytes:
        if key == ACK_KEY:
            return self._ack
        a = self.assignment
        if key != CAP_KEY or (a is None and not self._started):
            raise ConfigError(f"fleet member {self.name!r}: no value under {key!r}")
        # No share of its own yet (joined, or joined again), or its lease ran out unrenewed
        # (the plan's power may be the others'): the lowest-power plan, not an uncapped one.
        if a is None or self._lapsed:
            lowest_w = min(self.job.average_power_w) / self.replicas * (1 + _CAP_SLACK)
            token = "pending" if a is None else f"lapsed-{a.epoch}"
            return f"{lowest_w!r} pipeline {token}".encode()
        cap_w = a.cap_w / self.replicas * (1 + _CAP_SLACK)
        return f"{cap_w!r} pipeline {a.epoch}".encode()

    def set(self, key: str, value: str | bytes) -> None:
        if key != ACK_KEY:
            raise ConfigError(f"fleet member {self.name!r}: only {ACK_KEY!r} is written")
        self._ack = value.encode() if isinstance(value, str) else value
        token, _, iteration = self._ack.decode().partition(" ")
        a = self.assignment
        if a is not None and token == str(a.epoch):
            # read when iteration `iteration` ended: in force from the next one
            after = int(iteration) + 1 if iteration.isdecimal() else None
            try:
                self.registry.acknowledge(self.name, a.point, after)
            except ConfigError:
                raise
            except PerseusError as e:  # shown by `fleet status` only: the training goes on
                log.warning("fleet member %s: acknowledgement not recorded (%s)", self.name, e)
