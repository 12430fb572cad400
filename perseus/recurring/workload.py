"""A recurring job as the traces describe it: recorded training paths and epoch costs (pure).

:mod:`perseus.recurring.trace` reads the files.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from perseus.errors import ConfigError
from perseus.recurring.cost import zeus_cost

__all__ = ["ZEUS_JOBS", "EpochCost", "JobSpec", "Workload"]


@dataclass(frozen=True, slots=True)
class JobSpec:
    """How a recurring job is defined (names as in the traces).

    Attributes:
        target_metric: Validation metric value that ends a run (matched in the trace to a
            relative 1e-9).
        max_epochs: Epoch budget of one run; a run not at the target by then failed.
        default_batch_size: ``b0``, what the job uses without perseus.
    """

    dataset: str
    network: str
    optimizer: str
    target_metric: float
    max_epochs: int
    default_batch_size: int

    @property
    def key(self) -> str:
        """``"<dataset>/<network>"``, the name used on the command line and in JSON."""
        return f"{self.dataset}/{self.network}"


# The jobs of Zeus's trace-driven evaluation (its artifact's ``get_job_with_defaults``).
ZEUS_JOBS: tuple[JobSpec, ...] = (
    JobSpec("cifar100", "shufflenetv2", "adadelta", 0.6, 100, 1024),
    JobSpec("imagenet", "resnet50", "adadelta", 0.65, 100, 256),
    JobSpec("squad", "bert_base_uncased", "adamw", 84.0, 6, 32),
    JobSpec("librispeech", "deepspeech2", "adamw", 40.0, 16, 256),
    JobSpec("movielens-1m", "ncf", "adam", 0.41, 100, 1024),
    JobSpec("sentiment140", "bert_base_uncased", "adamw", 0.84, 10, 128),
)


@dataclass(frozen=True, slots=True)
class EpochCost:
    """Duration and average GPU power of one epoch at a batch size and power limit."""

    time_s: float
    avg_power_w: float

    @property
    def energy_j(self) -> float:
        return self.time_s * self.avg_power_w


@dataclass(frozen=True)
class Workload:
    """One recurring job on one GPU type.

    Attributes:
        max_power_w: ``MAXPOWER``, the largest power limit in the GPU's trace.
        paths: Batch size -> epochs to target of every recorded seed (None: never reached).
        epochs: (batch size, power limit W) -> cost of one epoch.
        default_batch_size: ``b0``, one of the traced batch sizes
            (:func:`~perseus.recurring.trace.load_workloads` says which).
    """

    spec: JobSpec
    gpu: str
    max_power_w: float
    paths: Mapping[int, tuple[int | None, ...]]
    epochs: Mapping[tuple[int, int], EpochCost]
    default_batch_size: int
    batch_sizes: tuple[int, ...] = field(init=False)
    power_limits_w: Mapping[int, tuple[int, ...]] = field(init=False)

    def __post_init__(self) -> None:
        by_size: dict[int, list[int]] = {}  # one pass: a scan per batch size was O(B x E)
        for b, pl in self.epochs:
            by_size.setdefault(b, []).append(pl)
        sizes = tuple(sorted(b for b in self.paths if b in by_size))
        if not sizes:
            raise ConfigError(
                f"{self.spec.key} on {self.gpu}: no batch size is in both the train and the "
                "power trace; check the dataset/network/optimizer columns"
            )
        limits = {b: tuple(sorted(by_size[b])) for b in sizes}
        object.__setattr__(self, "batch_sizes", sizes)
        object.__setattr__(self, "power_limits_w", limits)
        if self.default_batch_size not in sizes:
            raise ConfigError(
                f"{self.spec.key} on {self.gpu}: default batch size {self.default_batch_size} "
                f"is not among the traced batch sizes {list(sizes)}"
            )

    @property
    def key(self) -> str:
        return self.spec.key

    def max_power_limit_w(self, batch_size: int) -> int:
        """The highest power limit traced at ``batch_size`` (the default configuration's)."""
        return self.power_limits_w[batch_size][-1]

    def epoch_cost(self, batch_size: int, power_limit_w: int, eta: float) -> float:
        """Cost of one epoch at a configuration."""
        epoch = self.epochs[(batch_size, power_limit_w)]
        return zeus_cost(epoch.energy_j, epoch.time_s, eta, self.max_power_w)

    def optimal_power_limit_w(self, batch_size: int, eta: float) -> int:
        """The power limit with the smallest epoch cost at ``batch_size`` (ties: higher)."""
        return min(
            self.power_limits_w[batch_size],
            key=lambda pl: (self.epoch_cost(batch_size, pl, eta), -pl),
        )

    def converges(self, batch_size: int) -> bool:
        """Every recorded seed reaches the target within the epoch budget."""
        return all(e is not None for e in self.paths[batch_size])

    def expected_cost(self, batch_size: int, power_limit_w: int, eta: float) -> float:
        """Mean cost of one run over the recorded seeds (only meaningful when it converges)."""
        runs = [e for e in self.paths[batch_size] if e is not None]
        if not runs:
            raise ConfigError(f"{self.key}: batch size {batch_size} never reaches the target")
        return sum(runs) / len(runs) * self.epoch_cost(batch_size, power_limit_w, eta)

    def oracle(self, eta: float) -> tuple[int, int]:
        """Best fixed (batch size, power limit) in hindsight among always-converging sizes.

        Raises:
            ConfigError: if no batch size converges for every recorded seed.
        """
        candidates = [
            (self.expected_cost(b, pl, eta), b, pl)
            for b in self.batch_sizes
            if self.converges(b)
            for pl in self.power_limits_w[b]
        ]
        if not candidates:
            raise ConfigError(
                f"{self.key} on {self.gpu}: no batch size reaches the target "
                f"{self.spec.target_metric} in every recorded run"
            )
        _, b, pl = min(candidates)
        return b, pl
