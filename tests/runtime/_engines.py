"""Helpers shared by the engine adapter tests: a recording op factory and a gloo launcher."""

from __future__ import annotations

import os
import socket
import tempfile
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import numpy as np

from perseus.dag import build_dag
from perseus.schedule import Action, Schedule


def same_dag(a: Schedule, b: Schedule) -> None:
    """The two schedules give the same operation graph (nodes, rank order, edges, placement)."""
    ga, gb = build_dag(a), build_dag(b)
    assert ga.actions == gb.actions
    np.testing.assert_array_equal(ga.rank_start, gb.rank_start)
    np.testing.assert_array_equal(ga.edge_src, gb.edge_src)
    np.testing.assert_array_equal(ga.edge_dst, gb.edge_dst)
    assert a.stage_to_rank == b.stage_to_rank


class Recorder:
    """An ``OpContextFactory`` that logs enter/exit events around each action."""

    def __init__(self) -> None:
        self.events: list[tuple[str, str]] = []

    @contextmanager
    def __call__(self, action: Action) -> Iterator[None]:
        self.events.append(("enter", str(action)))
        yield
        self.events.append(("exit", str(action)))

    def mark(self, what: str) -> None:
        self.events.append(("compute", what))


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _entry(rank: int, world: int, port: int, out: str, fn: Callable[..., Any], args: Any) -> None:
    import pickle
    import warnings

    import torch
    import torch.distributed as dist

    warnings.simplefilter("ignore")  # engines' own notices; the parent's error filter is pytest's
    torch.set_num_threads(1)
    os.environ.update(
        MASTER_ADDR="127.0.0.1",
        MASTER_PORT=str(port),
        RANK=str(rank),
        WORLD_SIZE=str(world),
        LOCAL_RANK=str(rank),
    )
    result = fn(rank, world, *args)
    Path(out, f"{rank}.pkl").write_bytes(pickle.dumps(result))
    if dist.is_initialized():
        dist.barrier()
        dist.destroy_process_group()


def run_ranks(world: int, fn: Callable[..., Any], *args: Any) -> list[Any]:
    """Run ``fn(rank, world, *args)`` on ``world`` forked processes; return their results."""
    import pickle

    import torch.multiprocessing as mp

    with tempfile.TemporaryDirectory() as out:
        mp.start_processes(
            _entry,
            args=(world, _free_port(), out, fn, args),
            nprocs=world,
            join=True,
            start_method="fork",
        )
        return [pickle.loads(Path(out, f"{r}.pkl").read_bytes()) for r in range(world)]
