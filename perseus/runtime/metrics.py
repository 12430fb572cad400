"""Per-iteration energy metrics for the dashboards users already watch.

A :class:`MetricsSink` turns each :class:`~perseus.runtime.session.IterationStats` into an
:class:`IterationMetrics` record for a JSON-lines file, a CSV file and Prometheus gauges.
``prometheus_client`` is imported only when a Prometheus output is asked for.
"""

from __future__ import annotations

import contextlib
import csv as csvlib
import errno
import json
import logging
import os
import re
import socket
import stat
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Protocol, TextIO

from perseus.device.base import GPU
from perseus.errors import ConfigError
from perseus.io._errors import describe_os_error
from perseus.io.atomic import check_distinct_outputs, open_output_dir
from perseus.plan import Frontier, PlanOp
from perseus.profile.two_clock import op_phases
from perseus.runtime.agent.readback import HeldOp
from perseus.runtime.collectives import all_gather_objects
from perseus.runtime.session import BoundaryHook, IterationStats
from perseus.schedule.actions import Schedule

__all__ = ["CSV_FIELDS", "IterationMetrics", "MetricsSink", "SessionView", "iteration_metrics"]

_log = logging.getLogger(__name__)


class SessionView(Protocol):
    """What a sink reads from a session (all public attributes of ``RankSession``)."""

    rank: int
    schedule: Schedule
    group: Any
    gpu: GPU
    frontier: Frontier | None

    def add_boundary_hook(self, hook: BoundaryHook) -> None: ...

    def remove_boundary_hook(self, hook: BoundaryHook) -> None: ...


@dataclass(frozen=True, slots=True)
class IterationMetrics:
    """One iteration of one rank, as dashboards want it (fields as in
    :class:`~perseus.runtime.session.IterationStats`, None where not known).

    Attributes:
        gpu: The GPU's name.
        time_error: ``time_s / predicted_time_s - 1``.
        energy_error: ``pipeline_energy_j / predicted_energy_j - 1``.
        clocks_mhz: This rank's planned clock per op, as in plan files (an int, or
            ``[freq_a_mhz, freq_b_mhz, layers_at_a]`` for a two-clock op).
        min_clock_mhz, max_clock_mhz: The lowest and highest clock in ``clocks_mhz``.
        held_ops: This rank's ops held off their planned clocks (CSV: ``name:planned>ran:why``,
            a memory clock held written ``name:planned>ran,memplanned>ran:why``).
    """

    iteration: int
    phase: str
    rank: int
    gpu: str
    time_s: float
    energy_j: float
    pipeline_energy_j: float | None
    predicted_time_s: float | None
    predicted_energy_j: float | None
    time_error: float | None
    energy_error: float | None
    point_index: int | None
    clocks_mhz: tuple[PlanOp, ...] | None
    min_clock_mhz: int | None
    max_clock_mhz: int | None
    clock_share_at_plan: float | None = None
    held_ops: tuple[HeldOp, ...] = ()
    pipeline_held_ops: int = 0
    host_overruns: int = 0

    def as_dict(self) -> dict[str, Any]:
        """A JSON-ready dict (two-clock ops as lists)."""
        out = asdict(self)
        # A held op's action as in messages (``"0F1"``), under ``name``.
        out["held_ops"] = [
            {"name": str(h.op)} | {k: v for k, v in asdict(h).items() if k != "op"}
            for h in self.held_ops
        ]
        if self.clocks_mhz is not None:
            out["clocks_mhz"] = [c if isinstance(c, int) else list(c) for c in self.clocks_mhz]
        return out


#: Columns of the CSV output, in order (``clocks_mhz`` as space-separated ops, a two-clock op
#: written ``A/B@K``).
CSV_FIELDS: tuple[str, ...] = tuple(IterationMetrics.__dataclass_fields__)

#: The fields a record copies from its :class:`IterationStats` (the pipeline's energy is the
#: sink's own gather).
_FROM_STATS = tuple(
    f for f in CSV_FIELDS if f in IterationStats.__dataclass_fields__ and f != "pipeline_energy_j"
)


def iteration_metrics(
    stats: IterationStats,
    *,
    rank: int,
    gpu: str,
    frontier: Frontier | None,
    pipeline_energy_j: float | None = None,
) -> IterationMetrics:
    """The metrics record of one iteration (pure: no collective, no I/O)."""
    clocks: tuple[PlanOp, ...] | None = None
    if frontier is not None and stats.point_index is not None and stats.phase == "run":
        clocks = frontier.points[stats.point_index].freqs_mhz[rank]
    flat = [ph.freq_mhz for op in clocks or () for ph in op_phases(op)]
    return IterationMetrics(
        **{name: getattr(stats, name) for name in _FROM_STATS},
        rank=rank,
        gpu=gpu,
        pipeline_energy_j=pipeline_energy_j,
        time_error=_ratio(stats.time_s, stats.predicted_time_s),
        energy_error=_ratio(pipeline_energy_j, stats.predicted_energy_j),
        clocks_mhz=clocks,
        min_clock_mhz=min(flat) if flat else None,
        max_clock_mhz=max(flat) if flat else None,
    )


def _ratio(measured: float | None, predicted: float | None) -> float | None:
    if measured is None or predicted is None or predicted <= 0:
        return None
    return measured / predicted - 1.0


class MetricsSink:
    """Writes an :class:`IterationMetrics` record at every iteration boundary of a session.

    The constructor does no I/O; :meth:`attach` (or ``with``) opens the files, starts the
    HTTP server if asked and subscribes to the session; :meth:`close` undoes all of it.

    Args:
        session: The session to follow (``RankSession``, ``PerseusPipeline``).
        jsonl: JSON-lines file, one flushed line per iteration (``{rank}`` in the name is
            replaced by the rank), truncated at :meth:`attach`.
        csv: CSV file with a header row (:data:`CSV_FIELDS`); ``{rank}`` as for ``jsonl``.
        prometheus_registry: A ``prometheus_client.CollectorRegistry`` for the gauges.
        prometheus_port: Serve the gauges over HTTP on this port (0: a free one, see
            :attr:`prometheus_port`).
        prometheus_addr: Address the HTTP server binds (default loopback only).
        labels: Constant labels added to every gauge (e.g. ``{"job": "gpt3"}``).
        pipeline: Gather every rank's energy for the pipeline figure (a collective over the
            session's group at each boundary: all ranks must have a sink).

    Raises:
        ConfigError: one line for a bad argument; at :meth:`attach`: one path for both files,
            a port or address that cannot be bound, a file that cannot be created, a
            Prometheus output without ``prometheus_client`` installed.
    """

    def __init__(
        self,
        session: SessionView,
        *,
        jsonl: str | os.PathLike[str] | None = None,
        csv: str | os.PathLike[str] | None = None,
        prometheus_registry: Any = None,
        prometheus_port: int | None = None,
        prometheus_addr: str = "127.0.0.1",
        labels: dict[str, str] | None = None,
        pipeline: bool = True,
    ) -> None:
        _check_arguments(jsonl, csv, prometheus_registry, prometheus_port, prometheus_addr, labels)
        if not isinstance(pipeline, bool):
            raise ConfigError(f"MetricsSink: `pipeline` must be True or False, got {pipeline!r}")
        self.session = session
        self._paths = {
            kind: Path(str(path).replace("{rank}", str(session.rank)))
            for kind, path in (("jsonl", jsonl), ("csv", csv))
            if path is not None
        }
        self._registry = prometheus_registry
        self._port = prometheus_port
        self._addr = prometheus_addr
        self._labels = dict(labels or {})
        self._pipeline = pipeline
        self._files: dict[str, TextIO] = {}
        #: Each file's size after its last whole record: a full disk cuts it back there.
        self._whole: dict[str, int] = {}
        self._csv: Any = None
        self._gauges: _Gauges | None = None
        self._server: Any = None
        self._attached = False
        #: The latest record (None before the first boundary).
        self.latest: IterationMetrics | None = None

    @property
    def prometheus_port(self) -> int | None:
        """The port the HTTP server listens on (None when not serving)."""
        return None if self._server is None else int(self._server.server_address[1])

    def attach(self) -> MetricsSink:
        """Open the outputs and subscribe to the session's boundaries (idempotent)."""
        if self._attached:
            return self
        check_distinct_outputs({f"MetricsSink `{k}`": p for k, p in self._paths.items()})
        try:
            for kind, path in self._paths.items():
                self._files[kind] = _open_log(path)
            if "csv" in self._files:
                self._csv = csvlib.writer(self._files["csv"], lineterminator="\n")
                try:
                    self._csv.writerow(CSV_FIELDS)
                    self._mark_whole()
                except OSError as e:
                    raise ConfigError(
                        f"{self._paths['csv']}: cannot write the metrics file "
                        f"({describe_os_error(e)}); free space or choose another path"
                    ) from e
            if self._registry is not None or self._port is not None:
                self._start_prometheus()
        except BaseException:
            self._drop_files()  # what could not be written is not reported twice
            # Out of the registry again: a retry (another port) may register them anew.
            gauges, self._gauges = self._gauges, None
            if gauges is not None:
                gauges.unregister()
            self.close()
            raise
        self.session.add_boundary_hook(self)
        self._attached = True
        return self

    def close(self) -> None:
        """Unsubscribe, close the files, stop the HTTP server (idempotent)."""
        if self._attached:
            self.session.remove_boundary_hook(self)
            self._attached = False
        self._close_files()
        server, self._server = self._server, None
        if server is not None:
            server.shutdown()
            server.server_close()

    def __enter__(self) -> MetricsSink:
        return self.attach()

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __call__(self, stats: IterationStats) -> None:
        """The boundary hook: write the iteration's record to every output."""
        session = self.session
        pipeline_j = None
        if self._pipeline:
            # Every rank gathers, whatever its outputs do next, so no rank waits alone.
            energies = all_gather_objects(float(stats.energy_j), session.group)
            if len(energies) == session.schedule.num_ranks:
                pipeline_j = float(sum(energies))
        # The frontier the iteration ran (a real GPU's stats come one iteration late, when
        # another frontier may run already: its point_index indexes the one it ran).
        frontier = getattr(session, "stats_frontier", session.frontier)
        record = iteration_metrics(
            stats,
            rank=session.rank,
            gpu=str(session.gpu.name),
            frontier=frontier,
            pipeline_energy_j=pipeline_j,
        )
        self.latest = record
        self._write(record)
        if self._gauges is not None:
            self._gauges.update(record)

    def _write(self, record: IterationMetrics) -> None:
        # A full disk must not stop a training run: report once, stop writing files.
        try:
            if "jsonl" in self._files:
                self._files["jsonl"].write(json.dumps(record.as_dict()) + "\n")
            if self._csv is not None:
                self._csv.writerow(_csv_row(record))
            self._mark_whole()
        except OSError as e:
            self._drop_files(e)

    def _mark_whole(self) -> None:
        # Line-buffered: each record (one line, one write) is in the file once written.
        for kind, f in self._files.items():
            self._whole[kind] = os.lseek(f.fileno(), 0, os.SEEK_CUR)

    def _drop_files(self, error: OSError | None = None) -> None:
        if error is not None:
            _log.warning(
                "metrics files: cannot write (%s); no further records are written to %s",
                describe_os_error(error),
                ", ".join(str(p) for p in self._paths.values()),
            )
        for kind, f in self._files.items():
            if error is not None and not f.closed:  # no half record at the end; what is
                with contextlib.suppress(OSError, ValueError):  # still buffered is lost
                    os.ftruncate(f.fileno(), self._whole.get(kind, 0))
                    _discard_writes(f.fileno())
            with contextlib.suppress(OSError):
                f.close()
        self._files.clear()
        self._csv = None

    def _close_files(self) -> None:
        # Closing flushes the last line: a full disk then is reported as in _write, not raised.
        try:
            for f in self._files.values():
                f.close()
        except OSError as e:
            self._drop_files(e)
        self._drop_files()

    def _start_prometheus(self) -> None:
        try:
            import prometheus_client
        except ImportError:
            raise ConfigError(
                "Prometheus metrics need prometheus_client: pip install 'perseus-energy[metrics]'"
            ) from None
        registry = self._registry
        if registry is None:
            registry = prometheus_client.CollectorRegistry()
        self._gauges = _Gauges(prometheus_client, registry, self.session.rank, self._labels)
        if self._port is not None:
            self._server = _serve(prometheus_client, self._port, self._addr, registry)
            _log.info(
                "Prometheus metrics on http://%s:%d/metrics", self._addr, self.prometheus_port
            )


#: Prometheus gauge name -> (help, extra label).
_GAUGES: dict[str, tuple[str, tuple[str, ...]]] = {
    "perseus_iteration": ("Index of the latest iteration", ()),
    "perseus_profiling": ("1 while the online sweep runs, else 0", ()),
    "perseus_iteration_time_seconds": ("Measured iteration time", ()),
    "perseus_iteration_energy_joules": (
        "Energy of the latest iteration: this GPU (scope=gpu) or the pipeline",
        ("scope",),
    ),
    "perseus_predicted_iteration_time_seconds": ("The deployed plan point's time", ()),
    "perseus_predicted_iteration_energy_joules": (
        "The deployed plan point's energy of the whole pipeline",
        (),
    ),
    "perseus_plan_point_index": ("The deployed frontier point", ()),
    "perseus_deployed_clock_mhz": ("Lowest/highest clock this rank's plan sets", ("bound",)),
    "perseus_clock_share_at_plan": ("Share of this rank's op time at the planned clock", ()),
    "perseus_held_ops": (
        "Ops run below their planned clock: this GPU (scope=gpu) or the pipeline",
        ("scope",),
    ),
    "perseus_host_overruns": ("Emulation: host overruns, last iteration", ()),
}


class _Gauges:
    """The Prometheus side: gauges for the latest iteration, counters for running totals."""

    def __init__(self, client: Any, registry: Any, rank: int, labels: dict[str, str]) -> None:
        names = ["rank", *labels]
        self._values = [str(rank), *labels.values()]
        self._registry = registry
        self._made: list[Any] = []  # registered so far (unregistered if a later one fails)
        try:
            self._gauges = {
                name: self._made_one(client.Gauge(name, doc, [*names, *extra], registry=registry))
                for name, (doc, extra) in _GAUGES.items()
            }
            self.energy_total, self.iterations_total = (
                self._made_one(client.Counter(name, doc, names, registry=registry))
                for name, doc in (
                    ("perseus_energy_joules", "This GPU's energy over all iterations"),
                    ("perseus_iterations", "Iterations measured"),
                )
            )
        except BaseException:
            self.unregister()
            raise

    def _made_one(self, collector: Any) -> Any:
        self._made.append(collector)
        return collector

    def unregister(self) -> None:
        """Take every gauge and counter out of the registry (idempotent)."""
        while self._made:
            with contextlib.suppress(KeyError):
                self._registry.unregister(self._made.pop())

    def update(self, r: IterationMetrics) -> None:
        for name, extra, value in (
            ("perseus_iteration", (), r.iteration),
            ("perseus_profiling", (), 1 if r.phase == "profile" else 0),
            ("perseus_iteration_time_seconds", (), r.time_s),
            ("perseus_iteration_energy_joules", ("gpu",), r.energy_j),
            ("perseus_iteration_energy_joules", ("pipeline",), r.pipeline_energy_j),
            ("perseus_predicted_iteration_time_seconds", (), r.predicted_time_s),
            ("perseus_predicted_iteration_energy_joules", (), r.predicted_energy_j),
            ("perseus_plan_point_index", (), r.point_index),
            ("perseus_deployed_clock_mhz", ("min",), r.min_clock_mhz),
            ("perseus_deployed_clock_mhz", ("max",), r.max_clock_mhz),
            ("perseus_clock_share_at_plan", (), r.clock_share_at_plan),
            ("perseus_held_ops", ("gpu",), len(r.held_ops)),
            ("perseus_held_ops", ("pipeline",), r.pipeline_held_ops),
            ("perseus_host_overruns", (), r.host_overruns),
        ):
            if value is not None:
                self._gauges[name].labels(*self._values, *extra).set(value)
        self.energy_total.labels(*self._values).inc(max(0.0, r.energy_j))
        self.iterations_total.labels(*self._values).inc()


def _csv_row(r: IterationMetrics) -> list[Any]:
    row = r.as_dict()
    if r.clocks_mhz is not None:
        row["clocks_mhz"] = " ".join(
            str(c) if isinstance(c, int) else f"{c[0]}/{c[1]}@{c[2]}" for c in r.clocks_mhz
        )
    row["held_ops"] = " ".join(_held_text(h) for h in r.held_ops)
    return ["" if row[k] is None else row[k] for k in CSV_FIELDS]


def _held_text(h: HeldOp) -> str:
    """One held op as the CSV writes it (see :class:`IterationMetrics`)."""
    held_mem = None not in (h.planned_mem_mhz, h.applied_mem_mhz)
    mem = f",mem{h.planned_mem_mhz}>{h.applied_mem_mhz}" if held_mem else ""
    return f"{h.op}:{h.planned_mhz}>{h.applied_mhz}{mem}:{'+'.join(h.reasons)}"


def _discard_writes(fd: int) -> None:
    """Point ``fd`` at /dev/null: what its file object still buffers goes nowhere."""
    devnull = os.open(os.devnull, os.O_WRONLY | os.O_CLOEXEC)
    try:
        os.dup2(devnull, fd)
    finally:
        os.close(devnull)


def _open_log(path: Path) -> TextIO:
    """Open ``path`` truncated, without following a link; refuse anything but a regular file
    this user owns with one link."""
    flags = os.O_WRONLY | os.O_CREAT | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
    try:
        dfd = open_output_dir(path.parent)
        try:
            fd = os.open(path.name, flags, 0o644, dir_fd=dfd)
        finally:
            os.close(dfd)
    except OSError as e:
        raise ConfigError(
            f"{path}: cannot open the metrics file ({describe_os_error(e)}); choose another path"
        ) from e
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode) or st.st_nlink != 1 or st.st_uid != os.geteuid():
            raise ConfigError(
                f"{path}: not a regular file of this user with one link; choose another path"
            )
        os.set_blocking(fd, True)
        os.ftruncate(fd, 0)
        return open(fd, "w", encoding="utf-8", newline="", buffering=1)
    except BaseException:
        os.close(fd)
        raise


#: Prometheus label names (the exposition format's rule); ``__`` is reserved for Prometheus.
_LABEL_NAME = re.compile(r"^[a-zA-Z_][a-zA-Z0-9_]{0,99}$")
_OWN_LABELS = ("rank", "scope", "bound")


def _check_arguments(
    jsonl: object, csv: object, registry: object, port: object, addr: object, labels: object
) -> None:
    """Raise one :class:`ConfigError` line for :class:`MetricsSink`'s first bad argument."""
    if jsonl is None and csv is None and registry is None and port is None:
        raise ConfigError(
            "MetricsSink needs an output: `jsonl`, `csv`, `prometheus_registry` or "
            "`prometheus_port`"
        )
    for name, path in (("jsonl", jsonl), ("csv", csv)):
        if path is not None and (not isinstance(path, str | os.PathLike) or not str(path)):
            raise ConfigError(f"MetricsSink: `{name}` must be a file path, got {path!r:.60}")
    if port is not None and (
        isinstance(port, bool) or not isinstance(port, int) or not 0 <= port <= 65535
    ):
        raise ConfigError(
            f"MetricsSink: `prometheus_port` must be an integer in [0, 65535] (0: any free "
            f"port), got {port!r:.40}"
        )
    if not isinstance(addr, str) or not addr.strip():
        raise ConfigError(
            f"MetricsSink: `prometheus_addr` must be an address such as '127.0.0.1' or "
            f"'0.0.0.0', got {addr!r:.60}"
        )
    if registry is not None and not callable(getattr(registry, "register", None)):
        raise ConfigError(
            "MetricsSink: `prometheus_registry` must be a prometheus_client.CollectorRegistry, "
            f"got {type(registry).__name__}"
        )
    if labels is not None and not isinstance(labels, dict):
        raise ConfigError(
            f"MetricsSink: `labels` must be a dict of label name to value, got "
            f"{type(labels).__name__}"
        )
    for key, value in (labels or {}).items():
        if not isinstance(key, str) or not _LABEL_NAME.match(key) or key.startswith("__"):
            raise ConfigError(
                f"MetricsSink: `labels` key {key!r:.60} is not a Prometheus label name "
                "(letters, digits and _, not starting with a digit or __)"
            )
        if key in _OWN_LABELS:
            raise ConfigError(
                f"MetricsSink: `labels` key {key!r} is one perseus sets itself "
                f"({', '.join(_OWN_LABELS)}); rename it"
            )
        if not isinstance(value, str):
            raise ConfigError(f"MetricsSink: `labels[{key!r}]` must be a string, got {value!r:.60}")


def _serve(client: Any, port: int, addr: str, registry: Any) -> Any:
    try:
        server, _thread = client.start_http_server(port, addr=addr, registry=registry)
    except OSError as e:
        if e.errno == errno.EADDRINUSE:
            why = "is in use by another process; pick another with prometheus_port=... (0: any free port)"
        elif e.errno == errno.EACCES:
            why = "needs privileges (ports below 1024); pick another with prometheus_port=..."
        elif isinstance(e, socket.gaierror) or e.errno == errno.EADDRNOTAVAIL:
            why = (
                f"cannot be bound: {addr!r} is not an address of this host ({e.strerror or e}); "
                "pass another prometheus_addr= (127.0.0.1, 0.0.0.0)"
            )
        else:
            why = f"cannot be served ({describe_os_error(e)})"
        raise ConfigError(f"MetricsSink: port {port} on {addr} {why}") from None
    return server
