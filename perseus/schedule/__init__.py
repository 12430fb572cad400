"""Pipeline schedules as data: the action IR, builders and validation (pure)."""

from perseus.schedule.actions import Action, Kind, Schedule, format_grid, parse_op_name
from perseus.schedule.builders import (
    SCHEDULE_NAMES,
    build_schedule,
    gpipe,
    interleaved_1f1b,
    one_f_one_b,
    schedule_from_actions,
    zero_bubble_h1,
)
from perseus.schedule.dependencies import action_dependencies
from perseus.schedule.validate import validate_schedule

__all__ = [
    "SCHEDULE_NAMES",
    "Action",
    "Kind",
    "Schedule",
    "action_dependencies",
    "build_schedule",
    "format_grid",
    "gpipe",
    "interleaved_1f1b",
    "one_f_one_b",
    "parse_op_name",
    "schedule_from_actions",
    "validate_schedule",
    "zero_bubble_h1",
]
