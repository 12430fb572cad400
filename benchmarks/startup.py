"""How long do `import perseus`, `perseus --help` and a small job take, and how does a past
revision compare?

Every figure is a fresh process, as a user meets it:

* ``import perseus``: seconds spent in the import statement (timed inside the process, so
  the interpreter's own start-up is left out), and whether networkx was loaded;
* the planning core, ``import perseus.job, perseus.solver, perseus.io`` (the same statement in
  every revision, whatever ``perseus`` itself loads eagerly), timed the same way;
* ``perseus --help``: the whole process, interpreter included, in wall-clock and CPU seconds
  (user + system, which another job on the machine inflates less), and the number of modules
  it leaves loaded (``sys.modules``, counted in-process);
* a small job, ``perseus frontier a100 --microbatches 4`` (8 stages x 4 microbatches): the
  whole process with the solver kernels already in numba's disk cache (one untimed run fills
  it first);
* with ``--demo``: ``perseus demo`` with an empty numba cache (the first run after install),
  wall and CPU, then warm; ``--demo-repeats N`` cold runs per tree. A tree whose solver
  kernels were built at install (``perseus/solver/_kernels*.so``, :mod:`perseus.solver.aot`)
  uses them; an exported ``--against`` revision has none built, so numba compiles there.

``--against REV`` exports that git revision to a temporary folder and measures it the same way
in the same run, interleaved with this tree (A, B, A, B...) so that a change in the machine's
load hits both alike, and prints the ratios.

    python benchmarks/startup.py [--against REV] [--repeats 7] [--demo] [--demo-repeats 3]
"""

from __future__ import annotations

import argparse
import os
import resource
import statistics
import subprocess
import sys
import tarfile
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent

_IMPORT = (
    "import sys, time\n"
    "t = time.perf_counter()\n"
    "import perseus\n"
    "dt = time.perf_counter() - t\n"
    "print(dt, 'networkx' in sys.modules, perseus.__file__)\n"
)
_CORE = (
    "import time\n"
    "t = time.perf_counter()\n"
    "import perseus.job, perseus.solver, perseus.io\n"
    "print(time.perf_counter() - t)\n"
)
_HELP_MODULES = (
    "import contextlib, io, sys\n"
    "from perseus.cli.main import main\n"
    "with contextlib.redirect_stdout(io.StringIO()), contextlib.suppress(SystemExit):\n"
    "    main(['--help'])\n"
    "print(len(sys.modules))\n"
)


@dataclass
class Tree:
    """A source tree measured: this checkout or an exported revision."""

    label: str
    root: Path
    cache: Path  # NUMBA_CACHE_DIR of this tree's runs
    figures: dict[str, list[float]] = field(default_factory=dict)
    networkx: bool | None = None
    help_modules: int | None = None
    last_cpu_s: float = 0.0  # user + system seconds of the last run's process

    def env(self, cache: Path | None = None) -> dict[str, str]:
        return dict(
            os.environ,
            PYTHONPATH=str(self.root),
            NUMBA_CACHE_DIR=str(cache or self.cache),
        )

    def run(self, args: list[str], cwd: Path, cache: Path | None = None) -> float:
        before = resource.getrusage(resource.RUSAGE_CHILDREN)
        started = time.perf_counter()
        subprocess.run(
            [sys.executable, *args],
            check=True,
            cwd=cwd,
            env=self.env(cache),
            stdout=subprocess.DEVNULL,
        )
        elapsed = time.perf_counter() - started
        after = resource.getrusage(resource.RUSAGE_CHILDREN)
        self.last_cpu_s = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
        return elapsed

    def add(self, name: str, value: float) -> None:
        self.figures.setdefault(name, []).append(value)


def _export(rev: str, into: Path) -> str:
    """Write revision ``rev`` of this repository into ``into``; returns its short hash."""
    short = subprocess.run(
        ["git", "-C", str(REPO), "rev-parse", "--short", rev],
        check=True,
        capture_output=True,
        text=True,
    ).stdout.strip()
    archive = into.parent / f"{short}.tar"
    with archive.open("wb") as out:
        subprocess.run(["git", "-C", str(REPO), "archive", rev], check=True, stdout=out)
    with tarfile.open(archive) as tar:
        tar.extractall(into, filter="data")
    archive.unlink()
    return short


def _describe() -> str:
    return subprocess.run(
        ["git", "-C", str(REPO), "describe", "--always", "--dirty"],
        capture_output=True,
        text=True,
    ).stdout.strip()


def _measure(tree: Tree, work: Path) -> None:
    """One repeat of each figure for ``tree``."""
    proc = subprocess.run(
        [sys.executable, "-c", _IMPORT],
        check=True,
        cwd=work,
        env=tree.env(),
        capture_output=True,
        text=True,
    )
    seconds, networkx, where = proc.stdout.split()
    if not Path(where).resolve().is_relative_to(tree.root.resolve()):
        raise SystemExit(f"{tree.label}: imported perseus from {where}, not from {tree.root}")
    tree.add("import perseus (in-process)", float(seconds))
    tree.networkx = networkx == "True"
    proc = subprocess.run(
        [sys.executable, "-c", _CORE],
        check=True,
        cwd=work,
        env=tree.env(),
        capture_output=True,
        text=True,
    )
    tree.add("import the planning core (in-process)", float(proc.stdout))
    tree.add("perseus --help (process)", tree.run(["-m", "perseus.cli", "--help"], work))
    tree.add("perseus --help CPU (process)", tree.last_cpu_s)
    proc = subprocess.run(
        [sys.executable, "-c", _HELP_MODULES],
        check=True,
        cwd=work,
        env=tree.env(),
        capture_output=True,
        text=True,
    )
    tree.help_modules = int(proc.stdout)
    out = work / f"{tree.label}-frontier.json"
    small = ["-m", "perseus.cli", "frontier", "a100", "--microbatches", "4", "--no-progress"]
    tree.add("small job: frontier a100 -m 4 (process)", tree.run([*small, "-o", str(out)], work))


def _demo(tree: Tree, work: Path, warm_runs: int, repeat: int) -> None:
    """One cold ``perseus demo`` (empty numba cache), then ``warm_runs`` warm ones."""
    cold = work / f"{tree.label}-cold-cache-{repeat}"
    cold.mkdir()
    demo = ["-m", "perseus.cli", "demo", "--no-progress", "-o", str(work / "report")]
    tree.add("demo, empty numba cache (process)", tree.run(demo, work, cache=cold))
    tree.add("demo, empty numba cache CPU (process)", tree.last_cpu_s)
    for _ in range(warm_runs):
        tree.add("demo, warm (process)", tree.run(demo, work, cache=cold))
        tree.add("demo, warm CPU (process)", tree.last_cpu_s)


def _cell(values: list[float] | None) -> str:
    if not values:
        return "-"
    med = statistics.median(values)
    return f"{med:.3f} s" if med < 10 else f"{med:.1f} s"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--against", metavar="REV", help="also measure this git revision")
    parser.add_argument("--repeats", type=int, default=7, help="runs per figure (default 7)")
    parser.add_argument("--demo", action="store_true", help="also time `perseus demo`")
    parser.add_argument("--demo-warm-runs", type=int, default=2)
    parser.add_argument("--demo-repeats", type=int, default=1, help="cold demo runs per tree")
    args = parser.parse_args()
    load_before = os.getloadavg()[0]
    with tempfile.TemporaryDirectory(prefix="perseus-startup-") as tmp:
        work = Path(tmp)
        trees = [Tree(f"this tree ({_describe()})", REPO, work / "cache-this")]
        if args.against:
            root = work / "against"
            root.mkdir()
            short = _export(args.against, root)
            trees.append(Tree(short, root, work / "cache-against"))
        for tree in trees:
            tree.cache.mkdir()
            # Fill this tree's numba cache (and its .pyc files): the timed runs are warm.
            warm = ["-m", "perseus.cli", "frontier", "a100", "--microbatches", "4"]
            tree.run([*warm, "--no-progress", "-o", str(work / "warm.json")], work)
        for _ in range(args.repeats):
            for tree in trees:
                _measure(tree, work)
        for repeat in range(args.demo_repeats if args.demo else 0):
            for tree in trees:
                _demo(tree, work, args.demo_warm_runs, repeat)
    load_after = os.getloadavg()[0]

    print(
        f"{os.cpu_count()} cores; load average (1 min) {load_before:.1f} before, "
        f"{load_after:.1f} after; median of {args.repeats} runs per figure (demo: {args.demo_repeats} cold runs)"
    )
    names = list(trees[0].figures)
    width = max(len(n) for n in names) + 2
    header = "".join(f"{t.label:>28}" for t in trees)
    if len(trees) == 2:
        header += f"{'this / ' + trees[1].label:>22}"
    print(f"{'':<{width}}{header}")
    for name in names:
        row = "".join(f"{_cell(t.figures.get(name)):>28}" for t in trees)
        if len(trees) == 2:
            a, b = trees[0].figures.get(name), trees[1].figures.get(name)
            if a and b:
                row += f"{statistics.median(a) / statistics.median(b):>21.2f}x"
        print(f"{name:<{width}}{row}")
    loaded = "".join(f"{'yes' if t.networkx else 'no':>28}" for t in trees)
    print(f"{'networkx loaded by import perseus':<{width}}{loaded}")
    counts = "".join(f"{t.help_modules!s:>28}" for t in trees)
    print(f"{'modules loaded by perseus --help':<{width}}{counts}")


if __name__ == "__main__":
    main()
