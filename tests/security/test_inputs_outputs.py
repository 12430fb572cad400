"""Root's perseus against a local user's traps: device nodes, FIFOs and links as inputs and
outputs.

Every command that reads a file is given a private ``/dev/zero`` (a character device 1:5 made
in a temp dir, never the real ``/dev``) and a FIFO nobody writes, under a memory cap: each is
refused in one line naming the file, exit 2, without reading it (no endless read, no hang).
Outputs onto a private ``/dev/null`` and a FIFO are written through (the node stays a node) or
refused in one line; links the attacker plants in a shared sticky directory are not followed.
Every target stays intact and no temporary file is left. Refusals that read nothing (links,
two outputs in one file) run in this process through the corpus's harness; what could read
without end runs in a child process under a memory cap.
"""

from __future__ import annotations

import json
import os
import shutil
import stat
import subprocess
import sys
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from perseus.io import load_profile, write_frontier
from perseus.io.profile_files import write_profile_csv
from perseus.job import make_job
from perseus.plan import SCHEMA_VERSION
from tests.corpus._harness import Case, check

from .conftest import Attacker, memory_cap

REPO = Path(__file__).resolve().parents[2]
TRACE = REPO / "perseus" / "data" / "traces" / "zeus-nsdi23"
#: Enough for any refusal; an endless read would hit it and fail the test, not the host.
MEMORY_CAP = 768 * 1024 * 1024
TIMEOUT_S = 120  # a FIFO that blocked a read would hang: fail instead


@dataclass(frozen=True)
class Result:
    rc: int
    out: str
    err: str

    @property
    def lines(self) -> list[str]:
        return self.err.splitlines()


def perseus(argv: list[str], cwd: Path) -> Result:
    proc = subprocess.run(
        [sys.executable, "-m", "perseus.cli", *argv],
        capture_output=True,
        text=True,
        cwd=cwd,
        env={**os.environ, "PYTHONPATH": str(REPO), "PERSEUS_SIM_DIR": str(cwd / "sim")},
        preexec_fn=memory_cap(MEMORY_CAP),
        timeout=TIMEOUT_S,
    )
    return Result(proc.returncode, proc.stdout, proc.stderr)


def assert_refused(result: Result, *mentions: str) -> None:
    assert "Traceback" not in result.err, result.err
    assert result.rc == 2, f"exit {result.rc}: {result.err!r}"
    assert len(result.lines) == 1, result.err
    line = result.lines[0]
    assert line.startswith("error: ") and len(line) < 800
    for m in mentions:
        assert m in line, f"{m!r} not in {line!r}"


def no_temporaries(*folders: Path) -> None:
    for folder in folders:
        left = [p.name for p in folder.rglob("*") if p.name.endswith(".tmp")]
        assert not left, f"temporary files left in {folder}: {left}"


def make_node(path: Path, kind: str) -> Path:
    """A private ``/dev/zero`` (character device 1:5), ``/dev/null`` (1:3) or a FIFO."""
    if kind == "fifo":
        os.mkfifo(path, 0o666)
    else:
        minor = {"zero": 5, "null": 3}[kind]
        try:
            os.mknod(path, 0o666 | stat.S_IFCHR, os.makedev(1, minor))
        except PermissionError:
            pytest.skip("creating device nodes needs CAP_MKNOD")
    return path


def node_intact(path: Path, kind: str) -> bool:
    st = os.lstat(path)
    if kind == "fifo":
        return stat.S_ISFIFO(st.st_mode)
    minor = {"zero": 5, "null": 3}[kind]
    return stat.S_ISCHR(st.st_mode) and st.st_rdev == os.makedev(1, minor)


@pytest.fixture(scope="module")
def private(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Root's own valid inputs, in a directory only root can enter."""
    if os.geteuid() != 0:
        pytest.skip("security tests play an attacker against root: run them as root (CI does)")
    d = tmp_path_factory.mktemp("private")
    d.chmod(0o700)
    a100 = load_profile("a100")
    job = make_job(
        a100, "1f1b", 8, 4, blocking_power_w=83.64, profile_name="gpt3-175b+a100_sxm_bf16"
    )
    slow = job.allmax().copy()
    slow[:] = 1200
    frontier = job.frontier([job.point(job.allmax()), job.point(slow)])
    write_frontier(frontier, d / "frontier.json")
    write_profile_csv(a100, d / "profile.csv")
    (d / "victim.txt").write_text("root's file\n")
    (d / "victim-dir").mkdir()
    (d / "victim-dir" / "keep.txt").write_text("keep\n")
    return d


# ------------------------------------------------------------------- inputs: every reader

_SIMULATE = ["recurring", "simulate", "--trace", str(TRACE), "--gpu", "a40"]
INPUTS: dict[str, list[str]] = {
    "frontier PROFILE": ["frontier", "{bad}", "--microbatches", "4", "-o", "{out}"],
    "evaluate PROFILE": ["evaluate", "{bad}", "--microbatches", "4"],
    "profile show": ["profile", "show", "{bad}"],
    "profile slice": ["profile", "slice", "{bad}", "--stages", "4", "-o", "{out}"],
    "frontier --config": ["frontier", "--config", "{bad}", "-o", "{out}"],
    "demo --config": ["demo", "--config", "{bad}", "-o", "{outdir}", "--no-progress"],
    "evaluate --plan": ["evaluate", "--plan", "{bad}"],
    "plan pick": ["plan", "pick", "{bad}", "--slowdown", "1", "-o", "{out}"],
    "report FRONTIER": ["report", "{bad}", "-o", "{outdir}"],
    "report --summary": ["report", "{frontier}", "--summary", "{bad}", "-o", "{outdir}"],
    "report --profile": ["report", "{frontier}", "--profile", "{bad}", "-o", "{outdir}"],
    "export": ["export", "{bad}", "--format", "zeus-pfo", "-o", "{outdir}"],
    "straggler-sweep": ["straggler-sweep", "{bad}", "--pipelines", "4", "-o", "{out}"],
    "recurring --jobs": [*_SIMULATE, "--jobs", "{bad}"],
    "recurring --trace": ["recurring", "simulate", "--trace", "{badtrace}", "--gpu", "a40"],
}


@pytest.fixture
def work(tmp_path: Path) -> Path:
    w = tmp_path / "work"
    w.mkdir()
    return w


def _fill(argv: list[str], **values: str) -> list[str]:
    return [a.format(**values) for a in argv]


@pytest.mark.parametrize("kind", ["zero", "fifo"])
@pytest.mark.parametrize("command", list(INPUTS), ids=list(INPUTS))
def test_a_device_or_fifo_is_refused_as_every_kind_of_input(
    private: Path, work: Path, command: str, kind: str
) -> None:
    bad = make_node(work / f"input-{kind}", kind)
    trace = work / "trace"
    trace.mkdir()
    make_node(trace / "summary_train.csv", kind)
    shutil.copy(TRACE / "summary_power_a40.csv", trace)
    argv = _fill(
        INPUTS[command],
        bad=str(bad),
        badtrace=str(trace),
        frontier=str(private / "frontier.json"),
        out=str(work / "out.json"),
        outdir=str(work / "outdir"),
    )
    before = sorted(p.name for p in work.iterdir())
    result = perseus(argv, work)
    named = str(trace / "summary_train.csv") if command == "recurring --trace" else str(bad)
    what = "a FIFO (named pipe)" if kind == "fifo" else "a character device"
    assert_refused(result, named, f"is {what}, not a regular file")
    assert node_intact(bad, kind) and node_intact(trace / "summary_train.csv", kind)
    assert sorted(p.name for p in work.iterdir()) == before  # nothing written
    no_temporaries(work)


@pytest.mark.parametrize("kind", ["zero", "fifo"])
def test_a_data_file_cannot_name_a_device_as_its_profile(
    private: Path, work: Path, kind: str
) -> None:
    """A plan's ``job.profile_name`` and a config's ``profile`` name a node beside them."""
    for name in ("zero", "zero.csv"):
        make_node(work / name, kind)
    doc = json.loads((private / "frontier.json").read_text())
    doc["job"]["profile_name"] = "zero"
    plan = work / "plan.json"
    plan.write_text(json.dumps(doc))
    result = perseus(["evaluate", "--plan", str(plan)], work)
    assert_refused(result, str(plan), "job.profile_name", "neither a bundled profile")
    config = work / "job.toml"
    config.write_text('profile = "zero.csv"\nmicrobatches = 4\nblocking_power_w = 80\n')
    result = perseus(["frontier", "--config", str(config), "-o", str(work / "f.json")], work)
    assert_refused(result, str(work / "zero.csv"), "not a regular file")
    assert node_intact(work / "zero", kind) and node_intact(work / "zero.csv", kind)
    no_temporaries(work)


# ------------------------------------------------------------------- outputs


def _pick(private: Path, out: str) -> list[str]:
    return ["plan", "pick", str(private / "frontier.json"), "--slowdown", "1", "-o", out]


def test_output_onto_a_private_dev_null_is_written_through(private: Path, work: Path) -> None:
    null = make_node(work / "null", "null")
    result = perseus(_pick(private, str(null)), work)
    assert result.rc == 0, result.err
    assert node_intact(null, "null")  # still the device, not a regular file in its place
    assert sorted(p.name for p in work.iterdir()) == ["null"]


def test_output_onto_a_fifo_nobody_reads_is_refused_at_once(private: Path, work: Path) -> None:
    fifo = make_node(work / "pipe", "fifo")
    result = perseus(_pick(private, str(fifo)), work)
    assert_refused(result, str(fifo), "FIFO that no process reads")
    assert node_intact(fifo, "fifo")
    assert sorted(p.name for p in work.iterdir()) == ["pipe"]


def test_output_onto_a_fifo_with_a_reader_is_written_through(private: Path, work: Path) -> None:
    fifo = make_node(work / "pipe", "fifo")
    got: list[bytes] = []

    def read() -> None:
        with open(fifo, "rb") as f:  # waits for the writer
            got.append(f.read())

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    result = perseus(_pick(private, str(fifo)), work)
    reader.join(30)
    assert result.rc == 0, result.err
    assert json.loads(got[0])["schema_version"] == SCHEMA_VERSION
    assert node_intact(fifo, "fifo")


def test_output_to_stdout(private: Path, work: Path) -> None:
    result = perseus(_pick(private, "/dev/stdout"), work)
    assert result.rc == 0, result.err
    assert json.loads(result.out)["schema_version"] == SCHEMA_VERSION  # the summary went to stderr
    assert "wrote /dev/stdout" in result.err
    assert list(work.iterdir()) == []


@pytest.fixture
def planted(attacker: Attacker, public_tmp: Path, private: Path) -> Iterator[Path]:
    """The attacker's links in the shared sticky directory."""
    rootfile = public_tmp / "root-report.json"
    rootfile.write_text("root's report\n")
    attacker.sh(
        f"cd {public_tmp}\n"
        f"ln -s {private / 'victim.txt'} out.json\n"
        f"ln -s root-report.json alias.json\n"
        f"ln -s {private / 'victim-dir'} report\n"
        f"mkfifo trap.json\n"
        f"mkdir plots && ln -s {private / 'victim.txt'} plots/cifar100_shufflenetv2_cost.png\n"
        f"ln -s {private / 'victim-dir'} plots-link\n"
        f"ln -s {private} dirlink\n"
    )
    yield public_tmp


@dataclass(frozen=True)
class Trap:
    argv: list[str]
    mentions: tuple[str, ...]


def _traps(private: Path, shared: Path) -> dict[str, Trap]:
    frontier = str(private / "frontier.json")
    simulate = ["recurring", "simulate", "--trace", str(TRACE), "--gpu", "a40"]
    simulate += ["--workload", "cifar100/shufflenetv2", "--seeds", "1", "--recurrences", "5"]
    return {
        "link out of the directory": Trap(
            _pick(private, str(shared / "out.json")), ("out.json", "does not follow")
        ),
        "another user's link in the directory": Trap(
            _pick(private, str(shared / "alias.json")), ("owned by another user",)
        ),
        "a FIFO the attacker never reads": Trap(
            _pick(private, str(shared / "trap.json")), ("FIFO that no process reads",)
        ),
        "a linked report directory": Trap(
            ["report", frontier, "-o", str(shared / "report")], ("symbolic link",)
        ),
        "a linked export directory": Trap(
            ["export", frontier, "--format", "zeus-pfo", "-o", str(shared / "report")],
            ("symbolic link",),
        ),
        "a linked --plot directory": Trap(
            [*simulate, "--plot", str(shared / "plots-link")], ("--plot", "symbolic link")
        ),
        "another user's link above the output": Trap(
            _pick(private, str(shared / "dirlink" / "victim.txt")),
            ("dirlink", "owned by another user"),
        ),
        "another user's link above a report directory": Trap(
            ["report", frontier, "-o", str(shared / "dirlink" / "victim-dir")],
            ("dirlink", "owned by another user"),
        ),
        "a link planted as a plot file": Trap(
            [*simulate, "--plot", str(shared / "plots")], ("--plot", "cost.png")
        ),
    }


TRAP_NAMES = [
    "link out of the directory",
    "another user's link in the directory",
    "a FIFO the attacker never reads",
    "a linked report directory",
    "a linked export directory",
    "a linked --plot directory",
    "a link planted as a plot file",
    "another user's link above the output",
    "another user's link above a report directory",
]


@pytest.mark.parametrize("trap", TRAP_NAMES)
def test_links_and_fifos_planted_in_a_shared_directory_are_not_followed(
    planted: Path,
    private: Path,
    tmp_path: Path,
    trap: str,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    trapped = _traps(private, planted)[trap]
    before = {p.name: os.lstat(p) for p in planted.rglob("*")}
    check(Case(trap, trapped.argv, list(trapped.mentions)), tmp_path, {}, capsys, monkeypatch)
    assert (private / "victim.txt").read_text() == "root's file\n"
    assert sorted(p.name for p in (private / "victim-dir").iterdir()) == ["keep.txt"]
    assert (planted / "root-report.json").read_text() == "root's report\n"
    after = {p.name: os.lstat(p) for p in planted.rglob("*")}
    assert after.keys() == before.keys()
    for name, st in before.items():  # the attacker's links and FIFO are as they were
        assert (after[name].st_mode, after[name].st_ino) == (st.st_mode, st.st_ino)
    no_temporaries(planted, private, tmp_path)


# ------------------------------------------------------------------- two outputs, one file


def _two_files(work: Path, valid: dict[str, Path]) -> dict[str, str]:
    (work / "sub").mkdir()
    (work / "F.json").write_text("keep\n")
    (work / "link.json").symlink_to("F.json")
    os.link(work / "F.json", work / "hard.json")
    return {}


@pytest.mark.parametrize("curve", ["F.json", "sub/../F.json", "link.json", "hard.json"])
def test_one_file_named_for_two_outputs_is_refused(
    tmp_path: Path, curve: str, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """``-o F --power-curve F`` would replace the frontier with the power curve."""
    argv = ["frontier", "a100", "--microbatches", "4", "--no-progress", "-o", "{tmp}/F.json"]
    argv += ["--power-curve", "{tmp}/" + curve]
    case = Case(curve, argv, ["--power-curve", "the same file as -o {tmp}/F.json"], _two_files)
    check(case, tmp_path, {}, capsys, monkeypatch)
    assert (tmp_path / "work" / "F.json").read_text() == "keep\n"
    no_temporaries(tmp_path)


# ------------------------------------------------------------------- a full disk


_FILL_STORE = """
import resource, signal, sys
from perseus.errors import PerseusError
from perseus.recurring.store import SQLiteStore
store = SQLiteStore(sys.argv[1])
store.register_job("warm", {"x": 1})
# A file size limit fails writes as a full disk does (EFBIG; SQLite: disk I/O error / full).
signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
resource.setrlimit(resource.RLIMIT_FSIZE, (256 * 1024, resource.RLIM_INFINITY))
try:
    for i in range(100_000):
        store.register_job(f"job{i}", {"pad": "x" * 2000})
except PerseusError as e:
    print(type(e).__name__, e)
"""


def test_a_full_disk_under_the_recurring_store_is_not_called_damage(tmp_path: Path) -> None:
    folder = tmp_path / "store"
    folder.mkdir(mode=0o700)
    db = folder / "history.db"
    proc = subprocess.run(
        [sys.executable, "-c", _FILL_STORE, str(db)],
        capture_output=True,
        text=True,
        env={**os.environ, "PYTHONPATH": str(REPO)},
        timeout=TIMEOUT_S,
    )
    assert proc.returncode == 0, proc.stderr
    kind, _, message = proc.stdout.strip().partition(" ")
    assert kind == "PerseusError", proc.stdout  # not a ConfigError about the file
    assert "the disk is full, over quota or failing; free space" in message, message
    assert "backup" not in message and "not a usable SQLite database" not in message
    # What was committed before the disk filled is still there.
    from perseus.recurring.store import SQLiteStore

    assert SQLiteStore(db).history("warm") == []
