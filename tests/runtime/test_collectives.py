"""Collectives on gloo and NCCL-only groups: the NCCL path selected and exercised with a fake
backend (this machine has no CUDA), the gloo path in two real processes."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest

from perseus.runtime import collectives
from perseus.runtime.straggler.switching import StragglerRuntime, set_hint
from tests.runtime.plans import tiny_plan

torch = pytest.importorskip("torch")
dist = pytest.importorskip("torch.distributed")

REPO = Path(__file__).resolve().parents[2]


class FakeNccl:
    """A pretend NCCL-only group of ``peers`` other ranks: records what each collective got."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch, backend: str = "nccl") -> None:
        self.peer_values: list[float] = []
        self.devices: list[Any] = []
        self.calls: list[tuple[str, dict[str, Any]]] = []
        monkeypatch.setattr(collectives, "is_distributed", lambda: True)
        monkeypatch.setattr(dist, "get_backend", lambda group=None: backend)
        monkeypatch.setattr(dist, "get_rank", lambda group=None: 0)
        monkeypatch.setattr(torch.cuda, "current_device", lambda: 3)
        monkeypatch.setattr(collectives, "_to_device", self._to_device)
        monkeypatch.setattr(dist, "all_reduce", self._all_reduce)
        monkeypatch.setattr(dist, "broadcast_object_list", self._broadcast)
        monkeypatch.setattr(dist, "barrier", self._barrier)

    def _to_device(self, tensor: Any, device: Any) -> Any:
        self.devices.append(device)
        return tensor  # no CUDA here: keep it on the CPU, the device choice is what we check

    def _all_reduce(self, tensor: Any, op: Any = None, group: Any = None) -> None:
        self.calls.append(("all_reduce", {"op": op, "group": group, "dtype": tensor.dtype}))
        if self.peer_values:
            peer = torch.tensor(self.peer_values, dtype=tensor.dtype)
            tensor.copy_(torch.maximum(tensor, peer))

    def _broadcast(self, objects: list[Any], src: int = 0, group: Any = None, device: Any = None):
        self.calls.append(("broadcast_object_list", {"src": src, "device": device}))

    def _barrier(self, group: Any = None, device_ids: Any = None) -> None:
        self.calls.append(("barrier", {"device_ids": device_ids}))


def test_not_distributed_is_identity() -> None:
    assert collectives.all_reduce_max([1.0, 2.0]) == (1.0, 2.0)
    assert collectives.broadcast_object({"a": 1}) == {"a": 1}
    assert collectives.all_gather_objects(5) == [5]
    assert collectives.global_rank() == 0
    collectives.barrier()


@pytest.mark.parametrize(
    ("backend", "nccl_only"),
    [("nccl", True), ("NCCL", True), ("gloo", False), ("cpu:gloo,cuda:nccl", False)],
)
def test_device_follows_the_backend(
    monkeypatch: pytest.MonkeyPatch, backend: str, nccl_only: bool
) -> None:
    FakeNccl(monkeypatch, backend)
    assert collectives.uses_nccl() is nccl_only
    expected = torch.device("cuda", 3) if nccl_only else torch.device("cpu")
    assert collectives.collective_device() == expected


def test_straggler_exchange_on_an_nccl_only_group(monkeypatch: pytest.MonkeyPatch) -> None:
    fake = FakeNccl(monkeypatch)
    fake.peer_values = [0.0, 2.0, 0.0, 3.5]  # the other pipeline's time, and a hint
    store = dist.HashStore()
    set_hint(store, 0, 1.5)
    rt = StragglerRuntime(tiny_plan(), pipeline_index=0, num_pipelines=2, store=store)
    assert rt.exchange(1.0) == (1.5, 3.5)
    assert fake.devices == [torch.device("cuda", 3)]  # the buffer went to the CUDA device
    assert fake.calls == [
        ("all_reduce", {"op": dist.ReduceOp.MAX, "group": None, "dtype": torch.float64})
    ]


def test_broadcast_and_barrier_on_an_nccl_only_group(monkeypatch: pytest.MonkeyPatch) -> None:
    fake = FakeNccl(monkeypatch)
    assert collectives.broadcast_object("plan") == "plan"
    collectives.barrier()
    assert fake.calls == [
        ("broadcast_object_list", {"src": 0, "device": torch.device("cuda", 3)}),
        ("barrier", {"device_ids": [3]}),
    ]


def test_gloo_keeps_cpu_tensors(monkeypatch: pytest.MonkeyPatch) -> None:
    fake = FakeNccl(monkeypatch, backend="gloo")
    assert collectives.all_reduce_max([1.0]) == (1.0,)
    collectives.barrier()
    assert fake.devices == [torch.device("cpu")]
    assert fake.calls[-1] == ("barrier", {"device_ids": None})


GLOO_CHILD = textwrap.dedent(
    """
    import os, sys
    import torch.distributed as dist
    from perseus.runtime import collectives
    from perseus.runtime.straggler.switching import StragglerRuntime, raw_store, set_hint
    from tests.runtime.plans import tiny_plan

    rank = int(sys.argv[1])
    dist.init_process_group("gloo", init_method=sys.argv[2], rank=rank, world_size=2)
    store = raw_store(dist.distributed_c10d._get_default_store())
    if rank == 0:
        set_hint(store, 1, 9.0)
    collectives.barrier()
    rt = StragglerRuntime(tiny_plan(), pipeline_index=rank, num_pipelines=2, store=store)
    times = rt.exchange(1.0 + rank)
    plan = collectives.broadcast_object("from-0" if rank == 0 else None)
    gathered = collectives.all_gather_objects(rank * 10)
    print(times, plan, gathered, flush=True)
    dist.destroy_process_group()
    """
)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.mark.slow
def test_gloo_run_in_two_processes() -> None:
    url = f"tcp://127.0.0.1:{_free_port()}"
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", GLOO_CHILD, str(rank), url],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=env,
            cwd=REPO,
        )
        for rank in range(2)
    ]
    outs = [p.communicate(timeout=120) for p in procs]
    for p, (out, err) in zip(procs, outs, strict=True):
        assert p.returncode == 0, err
        # Rank 1's time 2.0 and rank 0's hint for pipeline 1 (9.0) reach both ranks.
        assert out.strip() == "(1.0, 9.0) from-0 [0, 10]", err
