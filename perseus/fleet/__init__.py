"""Many jobs, one power budget: the jobs file, the shared database and the fleet that follows.

:mod:`perseus.solver.fleet` is the pure planner; this package reads the jobs file
(:mod:`perseus.fleet.jobs`), keeps the fleet in a database (:mod:`perseus.fleet.registry`:
members, leases, budget, plans) and brings each job its plan (:mod:`perseus.fleet.member`).
"""

from perseus.fleet.jobs import FleetJobEntry, read_fleet_jobs

__all__ = ["FleetJobEntry", "read_fleet_jobs"]
