"""Many jobs, one power budget: the jobs file, the fleet's database and the members' plans.

:mod:`perseus.solver.fleet` is the pure planner; :mod:`~perseus.fleet.registry` keeps the
fleet in a database and :mod:`~perseus.fleet.member` brings each job its plan.
"""

from perseus.fleet.jobs import FleetJobEntry, read_fleet_jobs

__all__ = ["FleetJobEntry", "read_fleet_jobs"]
