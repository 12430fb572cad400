"""An error or Ctrl-C in the walk drops the queued lifting instead of waiting for it."""

from __future__ import annotations

import time

import numpy as np
import pytest

from perseus.solver import frontier, walk
from tests.solver.conftest import small_job


def test_an_error_in_the_walk_cancels_the_queued_lift_batches(monkeypatch):
    # The walk runs ahead of the lifting (36 batches of 0.7 s queued at 16 x 2000), and the
    # pools' exit waited for every one of them before the error (or KeyboardInterrupt) left.
    lifted = []

    def slow_lifted(self, batch):
        lifted.append(len(batch))
        if len(lifted) == 1:  # hold the first batch until the queued ones are cancelled
            for _ in range(3000):  # a guard only: 30 s without the cancel
                if len(self._batches) > 1 and self._batches[-1].cancelled():
                    break
                time.sleep(0.01)
        return []

    def failing_walk(folded, walk_args, lifter):
        for _ in range(5):
            lifter([np.zeros(folded.job.graph.num_nodes, dtype=np.int64)] * walk._LIFT_BATCH)
        raise RuntimeError("walk failed")

    monkeypatch.setattr(walk.Lifter, "_lifted", slow_lifted)
    monkeypatch.setattr(frontier, "_walk_folded", failing_walk)
    job = small_job("1f1b", 2, 16, clocks=3)
    with pytest.raises(RuntimeError, match="walk failed"):
        frontier.trace(job, fold=True)
    # at most the batch already running (none if the error came before the lane took it)
    assert lifted in ([], [walk._LIFT_BATCH])
