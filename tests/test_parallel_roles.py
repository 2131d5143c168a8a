"""Each rank's parallel role (mesh coordinates, pipeline stage) shown by the launch's per-rank rows.

The row text without processes; one real 4-process launch (gloo, CPU) through ``notebook_launcher`` with
``ParallelismConfig(dp_shard_size=2, tp_size=2)``, whose recorded events, text lines and final summary
must match what each rank's Accelerator says of itself; a 2-rank session whose status table and later
cells' rows keep the roles an earlier cell built. (Pipeline stages: tests/test_parallel_pp.py's launches.)
"""

from __future__ import annotations

import io

import pytest
import torch

from accel_nb.events import Progress, Result, Role
from accel_nb.launch.parent.launch_progress import LaunchProgress
from accel_nb.launch.parent.reporting import TextReporter
from accel_nb.parallel import ParallelismConfig
from accel_nb.parallel.roles import mesh_role, stage_detail, stage_role

pytestmark = pytest.mark.usefixtures("fresh_state")  # tests/conftest.py: one process, fresh state


class Recorder(TextReporter):
    """The text view into a string, keeping every event of each command it shows (a session runs several)."""

    def __init__(self) -> None:
        self.text = io.StringIO()
        self.commands: list[list] = []
        super().__init__(stream=self.text, merge_window=0.0)

    def start(self, num_processes, info):
        super().start(num_processes, info)
        self.commands.append([])

    def handle(self, event):
        self.commands[-1].append(event)
        super().handle(event)


# ------------------------------------------------------------------ the row text, no processes


def test_the_row_shows_the_dimensions_above_one_after_the_rank():
    pc = ParallelismConfig(dp_shard_size=2, tp_size=2)
    assert [mesh_role(pc, r).text() for r in range(4)] == [
        "dp 0 · tp 0",
        "dp 0 · tp 1",
        "dp 1 · tp 0",
        "dp 1 · tp 1",
    ]
    hsdp = ParallelismConfig(dp_replicate_size=2, dp_shard_size=2, cp_size=2)
    assert mesh_role(hsdp, 7).text() == "dp 1 · shard 1 · cp 1"  # both data dimensions: named apart
    assert mesh_role(ParallelismConfig(), 0).text() == ""  # one process: nothing to show
    assert (
        Role(rank=1, coords={"pp": 1}, sizes={"pp": 2}, detail="layers 2-3").text() == "pp 1/2 · layers 2-3"
    )

    state = LaunchProgress(4)
    state.apply(Progress(rank=3, name="train", n=5, total=10))
    for r in range(4):
        state.apply(mesh_role(pc, r))
    assert state.rank_line(3).startswith("rank 3 [dp 1 · tp 1] running ")
    state.apply(Result(rank=0, value=None))
    lines = state.summary_lines(ok=True)
    assert lines[1].startswith("  rank 0 [dp 0 · tp 0] done")
    # a rank with no role (yet) keeps the plain label, padded so the rows line up
    # the text view says a rank's role once, and again only when it changes (a retraced pipeline tells it again)
    text = TextReporter(stream=io.StringIO(), merge_window=0.0)
    text.start(2, {})
    for role in (mesh_role(pc, 1), mesh_role(pc, 1), stage_role(None, [], 1, 2), mesh_role(pc, 1)):
        text.handle(role)
    text.finish(True)
    assert text.out.getvalue().splitlines() == [
        "[rank 1] role: dp 0 · tp 1",
        "[rank 1] role: pp 1/2",
        "[rank 1] role: dp 0 · tp 1",
    ]
    plain = LaunchProgress(2)
    plain.apply(mesh_role(ParallelismConfig(tp_size=2), 1))
    assert [line[:16] for line in plain.summary_lines(ok=True)[1:]] == [
        "  rank 0        ",
        "  rank 1 [tp 1] ",
    ]


def test_the_widget_writes_the_role_under_each_rank_and_keeps_the_rows_lined_up():
    pytest.importorskip("ipywidgets")
    from accel_nb.notebook.live.progress_widget import LABEL_PX, WidgetReporter

    pc = ParallelismConfig(dp_shard_size=2, tp_size=2)
    view = WidgetReporter(4, display=False, echo_logs=False)
    view.start(4, {})
    assert view.labels[3].value == "<b>rank 3</b>"  # no role told yet
    for r in range(4):
        view.handle(mesh_role(pc, r))
    view.finish(True)
    assert "<b>rank 3</b><br>" in view.labels[3].value and "dp 1 · tp 1" in view.labels[3].value
    widths = {label.layout.flex for label in view.labels.values()}
    assert len(widths) == 1 and widths != {f"0 0 {LABEL_PX}px"}  # every label widened alike
    assert "  rank 2 [dp 1 · tp 0] done" in view.summary_text()
    # a session's start view (ready, idle) shows the roles a later cell built, on its own rows
    from accel_nb import Session

    session = Session(num_processes=2, cpu=True)  # not started: only its front end's view is used
    start = WidgetReporter(2, display=False, echo_logs=False, idle_when_done=True)
    start.start(2, {})
    start.finish(True)
    session._start_view = start  # what the session's start command made
    session.show_roles({r: mesh_role(ParallelismConfig(tp_size=2), r) for r in range(2)})
    assert "tp 1" in start.labels[1].value and "rank 1 [tp 1] ready (idle)" in start.summary_text()


def test_a_stage_names_the_blocks_it_holds():
    class Net(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.embed = torch.nn.Embedding(8, 4)
            self.layers = torch.nn.ModuleList(torch.nn.Linear(4, 4) for _ in range(8))
            self.head = torch.nn.Linear(4, 2)

    net = Net()
    assert [stage_detail(net, ["layers.4"], s) for s in (0, 1)] == ["layers 0-3", "layers 4-7"]
    assert [stage_detail(net, ["layers.1", "layers.2", "layers.7"], s) for s in range(4)] == [
        "layers 0",
        "layers 1",
        "layers 2-6",
        "layers 7",
    ]
    assert [stage_detail(net, ["head"], s) for s in (0, 1)] == ["up to head", "from head"]  # not a block
    assert stage_role(net, ["layers.4"], 1, 2).text() == "pp 1/2 · layers 4-7"


# ------------------------------------------------------------------ real launches


def _own_view() -> tuple[int, dict]:
    from accel_nb import Accelerator
    from accel_nb import ParallelismConfig as TopLevel

    acc = Accelerator(parallelism_config=TopLevel(dp_shard_size=2, tp_size=2))
    return acc.process_index, {
        "dp_replicate": acc.data_parallel_rank,
        "dp_shard": acc.data_parallel_shard_rank,
        "cp": acc.context_parallel_rank,
        "tp": acc.tensor_parallel_rank,
    }


@pytest.mark.multiproc
def test_a_four_process_launch_shows_each_ranks_mesh_coordinates():
    from accel_nb import notebook_launcher

    recorder = Recorder()
    results = notebook_launcher(_own_view, num_processes=4, cpu=True, reporter=recorder)
    roles = {e.rank: e for e in recorder.commands[-1] if isinstance(e, Role)}
    assert sorted(roles) == [0, 1, 2, 3]
    for rank, coords in results:
        # the role each rank told is what its Accelerator says of itself
        assert roles[rank].coords == coords
        assert roles[rank].sizes == {"dp_replicate": 1, "dp_shard": 2, "cp": 1, "tp": 2}
    text = recorder.text.getvalue()
    summary = recorder.state.summary_lines(ok=True)
    for rank, coords in results:
        shown = f"dp {coords['dp_shard']} · tp {coords['tp']}"
        assert f"[rank {rank}] role: {shown}\n" in text  # the text view says it once, at launch
        assert summary[1 + rank].startswith(f"  rank {rank} [{shown}] done")
    assert text.count("role:") == 4


@pytest.mark.multiproc
def test_a_session_keeps_each_ranks_role_for_later_cells_and_its_status():
    from accel_nb import Session
    from accel_nb.notebook.session_view import status_text

    recorder = Recorder()
    with Session(num_processes=2, cpu=True, progress=recorder) as session:
        assert all(row["role"] == "" for row in session.status())
        assert "role" not in status_text(session)
        session.run(
            "from accel_nb import Accelerator, ParallelismConfig\nacc = Accelerator(parallelism_config=ParallelismConfig(tp_size=2))"
        )
        assert [row["role"] for row in session.status()] == ["tp 0", "tp 1"]
        assert status_text(session).splitlines()[1].endswith("  role")
        session.run("acc.process_index")
        told = [e for e in recorder.commands[-1] if isinstance(e, Role)]
        # the next cell's rows show the roles again (passed on by the session), its text lines do not
        assert sorted((e.rank, e.again) for e in told) == [(0, True), (1, True)]
        assert recorder.state.rank_line(1).startswith("rank 1 [tp 1] done")
        assert recorder.text.getvalue().count("role: tp 1") == 1
