"""The run directory never shows half-written state as whole."""

from __future__ import annotations

import json

import torch
from rlinf_nb.runtime.rundir import JsonlLog, RunDir, atomic_write_bytes, dedupe_steps


def test_checkpoint_round_trip_and_pruning(tmp_path):
    rd = RunDir("r", root=tmp_path)
    rd.create({"a": 1})
    for step in (2, 4, 6, 8):
        rd.save_checkpoint(step, step * 10, {"w": torch.full((3,), float(step))}, keep=2)
    infos = rd.list_checkpoints()
    assert [i.step for i in infos] == [6, 8]
    state = rd.load_checkpoint(rd.latest_checkpoint())
    assert torch.equal(state["w"], torch.full((3,), 8.0))


def test_half_written_checkpoints_are_skipped(tmp_path):
    rd = RunDir("r", root=tmp_path)
    rd.create({})
    rd.save_checkpoint(1, 10, {"w": torch.ones(2)})
    good = rd.save_checkpoint(2, 20, {"w": torch.ones(2) * 2})
    # a writer killed before the manifest: no manifest
    torn = rd.checkpoints / "ckpt-00000003"
    torn.mkdir()
    (torn / "state.pt").write_bytes(b"partial")
    # a file truncated after the manifest was written (disk trouble): size mismatch
    bad = rd.save_checkpoint(4, 40, {"w": torch.ones(2) * 4})
    (bad / "state.pt").write_bytes(b"trunc")
    assert rd.latest_checkpoint().path == good
    assert [i.step for i in rd.list_checkpoints()] == [1, 2]


def test_torn_last_log_line_is_not_data(tmp_path):
    log = JsonlLog(tmp_path / "m.jsonl")
    log.append({"step": 1})
    log.append({"step": 2})
    with open(log.path, "a") as fh:
        fh.write('{"step": 3, "x"')  # a writer killed mid-row
    assert [r["step"] for r in log.read()] == [1, 2]


def test_dedupe_keeps_the_last_row_per_step():
    rows = [{"step": 1, "v": "a"}, {"step": 2, "v": "a"}, {"step": 2, "v": "b"}, {"step": 3, "v": "b"}]
    assert dedupe_steps(rows) == [{"step": 1, "v": "a"}, {"step": 2, "v": "b"}, {"step": 3, "v": "b"}]
    assert json.dumps(dedupe_steps([])) == "[]"


def test_a_rerun_from_a_checkpoint_drops_the_lost_timeline_even_past_where_it_got():
    """Steps 1-5 written, then the run went back to step 2's checkpoint and re-ran step 3 before it was
    stopped: the old rows 3, 4 and 5 are not the run's history any more."""
    rows = [{"step": s, "v": "old"} for s in range(1, 6)] + [{"step": 3, "v": "new"}]
    assert dedupe_steps(rows) == [{"step": 1, "v": "old"}, {"step": 2, "v": "old"}, {"step": 3, "v": "new"}]
    twice = rows + [{"step": 4, "v": "new"}, {"step": 2, "v": "newer"}]  # a second rollback, further back
    assert [(r["step"], r["v"]) for r in dedupe_steps(twice)] == [(1, "old"), (2, "newer")]


def test_two_threads_writing_one_file_atomically_each_leave_a_whole_file(tmp_path):
    """The controller's loop and a control call may write status.json or trace.json at once: every write
    succeeds, and the file always holds one writer's whole payload."""
    import threading

    path = tmp_path / "status.json"
    payloads = [bytes([65 + i]) * 200_000 for i in range(2)]
    errors: list[BaseException] = []

    def writer(data: bytes) -> None:
        try:
            for _ in range(40):
                atomic_write_bytes(path, data)
        except BaseException as exc:  # noqa: BLE001 - collected for the assert below
            errors.append(exc)

    threads = [threading.Thread(target=writer, args=(p,)) for p in payloads]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors
    assert path.read_bytes() in payloads
    assert [p.name for p in tmp_path.iterdir()] == ["status.json"]  # no temp file left behind
