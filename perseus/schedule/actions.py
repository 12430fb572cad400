"""The action IR: one compute action of one rank, in torch.distributed.pipelining's vocabulary.

``str(action)`` is torch's ``_Action`` spelling, ``"1F0"`` (stage 1's forward of microbatch 0);
``B`` is the full backward or, when a schedule splits it, the input-gradient half, ``W`` the
weight-gradient half. Plan files spell an action ``F3`` or ``F3@5`` (ranks holding several
stages): :func:`parse_op_name` reads that, :meth:`Action.op_name` writes it.
"""

from __future__ import annotations

import enum
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from perseus.errors import ScheduleError

__all__ = ["Action", "Kind", "Schedule", "format_grid", "parse_op_name"]


class Kind(str, enum.Enum):
    """Computation kind of an action; the value is torch's one-letter code."""

    F = "F"
    B = "B"
    W = "W"

    @property
    def profile_name(self) -> str:
        """The instruction name in profile files (``forward``/``backward``/``weight``)."""
        return _PROFILE_NAMES[self]

    @classmethod
    def from_profile_name(cls, name: str) -> Kind:
        """The kind of a profile instruction name; KeyError for an unknown name."""
        return _FROM_PROFILE_NAMES[name]


_PROFILE_NAMES = {Kind.F: "forward", Kind.B: "backward", Kind.W: "weight"}
_FROM_PROFILE_NAMES = {v: k for k, v in _PROFILE_NAMES.items()}

_OP_NAME_RE = re.compile(r"^([FBW])(\d{1,9})(?:@(\d{1,9}))?$")


@dataclass(frozen=True, slots=True, order=True)
class Action:
    """One compute action: ``kind`` of ``microbatch_index`` on ``stage_index``."""

    stage_index: int
    kind: Kind
    microbatch_index: int

    def __str__(self) -> str:
        return f"{self.stage_index}{self.kind.value}{self.microbatch_index}"

    def op_name(self, with_stage: bool) -> str:
        """The plan-file name: ``F3``, or ``F3@5`` when ranks hold several stages."""
        name = f"{self.kind.value}{self.microbatch_index}"
        return f"{name}@{self.stage_index}" if with_stage else name


def parse_op_name(name: str, rank: int) -> Action:
    """Parse a plan file's op name (``"F3"``, or ``"F3@5"``) of rank ``rank``: the stage is
    ``rank`` unless named after ``@``. :class:`ScheduleError` if not of that form."""
    match = _OP_NAME_RE.match(name)
    if match is None:
        raise ScheduleError(f"{name!r} is not an op name like 'F3' or 'F3@5'")
    stage = match.group(3)
    return Action(rank if stage is None else int(stage), Kind(match.group(1)), int(match.group(2)))


@dataclass(frozen=True, slots=True)
class Schedule:
    """A pipeline schedule: every rank's compute actions in execution order.

    Attributes:
        name: The builder's name or a free label.
        num_stages: Model stages (profile stages), ``num_ranks * virtual_stages``.
        num_microbatches: Microbatches per iteration.
        stage_to_rank: ``stage_to_rank[s]`` is the rank that runs stage ``s``.
        rank_actions: ``rank_actions[r]`` lists rank ``r``'s actions in execution order.
    """

    name: str
    num_stages: int
    num_microbatches: int
    stage_to_rank: tuple[int, ...]
    rank_actions: tuple[tuple[Action, ...], ...]

    @property
    def num_ranks(self) -> int:
        return len(self.rank_actions)

    @property
    def virtual_stages(self) -> int:
        return self.num_stages // max(1, self.num_ranks)

    @property
    def has_weight_actions(self) -> bool:
        return any(a.kind is Kind.W for acts in self.rank_actions for a in acts)

    def stage_ops(self) -> tuple[tuple[str, ...], ...]:
        """Per-rank op names as plan files write them (:meth:`Action.op_name`)."""
        with_stage = self.num_stages != self.num_ranks
        return tuple(tuple(a.op_name(with_stage) for a in acts) for acts in self.rank_actions)


def format_grid(
    columns: Sequence[Sequence[Action | str | None]],
    marked: Iterable[tuple[int, int]] = (),
    *,
    labels: Sequence[str] | None = None,
    window: int | None = None,
) -> str:
    """Render ops as a step × column grid (a column per rank, as torch's
    ``_format_pipeline_order``).

    Args:
        columns: Each column's ops by step (``None``: an empty cell).
        marked: ``(column, step)`` cells to flag with ``!``.
        labels: Column headers; ``Rank 0``, ``Rank 1``, ... by default.
        window: When cells are marked, show only steps within ``window`` of one (``...`` for
            the rest).
    """
    marks = set(marked)
    num_steps = max((len(c) for c in columns), default=0)
    steps = _shown_steps(marks, num_steps, window)
    cells = [[_cell(col, (c, step), marks) for c, col in enumerate(columns)] for step in steps]
    header = list(labels) if labels is not None else [f"Rank {c}" for c in range(len(columns))]
    width = max([len(h) for h in header] + [len(c) for row in cells for c in row] + [1])
    step_w = len(f"Step {max(num_steps - 1, 0):02d}")
    lines = [(" " * step_w + "  " + "  ".join(h.ljust(width) for h in header)).rstrip()]
    lines += ["..."] if steps.start > 0 else []
    for step, row in zip(steps, cells, strict=True):
        label = f"Step {step:02d}".ljust(step_w)
        lines.append(label + "  " + "  ".join(c.ljust(width) for c in row).rstrip())
    lines += ["..."] if steps.stop < num_steps else []
    return "\n".join(lines)


def _shown_steps(marks: set[tuple[int, int]], num_steps: int, window: int | None) -> range:
    if window is None or not marks:
        return range(num_steps)
    first = max(0, min(s for _, s in marks) - window)
    return range(first, min(num_steps, max(s for _, s in marks) + window + 1))


def _cell(
    col: Sequence[Action | str | None], at: tuple[int, int], marks: set[tuple[int, int]]
) -> str:
    op = col[at[1]] if at[1] < len(col) else None
    return "" if op is None else str(op) + ("!" if at in marks else "")
