"""albert_dist.tracking.goodput: a run's events file -> wall time, productive time and badput by cause, on hand-made
event files whose every figure is worked out here by hand; the recorder's events read back; the command's bad input.
"""
from __future__ import annotations

import json

import pytest

from albert_dist.cli import main as cli_main
from albert_dist.exit_codes import EXIT_HUNG
from albert_dist.tracking.goodput import CAUSES, EVENTS_FILE, GoodputRecorder, goodput


def _write(run_dir, events):
    run_dir.mkdir(exist_ok=True)
    (run_dir / EVENTS_FILE).write_text("".join(json.dumps(e) + "\n" for e in events))


def _mark(kind, t, step, from_step, elapsed, **phases):
    return {"event": kind, "t": t, "step": step, "from_step": from_step, "elapsed_s": elapsed, "phases": phases}


#: attempt 1 (launched at 1000): start-up 10 s (of which 2 s loading nothing: a fresh run has load 0), steps 0-10 in
#: 20 s (1 s data wait), a save of step 10 (3 s), steps 10-14 in 8 s, then killed: the launcher's exit comes 5 s after
#: the last event. Attempt 2 (launched at 2000): start-up 7 s with a 2 s load of step_10, steps 10-20 in 10 s (steps
#: 11-14 done before: 4/10 of the step time recomputed), an evaluation (1 s) and the final save (2 s) at step 20, the
#: end event 4 s later (export), the exit 1 s after it.
KILLED_THEN_FINISHED = [
    {"event": "start", "t": 1010.0, "step": 0, "begin_t": 1000.0, "launch_t": 1000.0, "load_s": 0.0},
    _mark("interval", 1030.0, 10, 0, 20.0, data_wait=1.0),
    _mark("save", 1033.0, 10, 10, 3.0, checkpoint_save=3.0),
    _mark("interval", 1041.0, 14, 10, 8.0),
    {"event": "exit", "t": 1046.0, "launch_t": 1000.0, "status": 1},
    {"event": "start", "t": 2007.0, "step": 10, "begin_t": 2000.0, "launch_t": 2000.0, "load_s": 2.0},
    _mark("interval", 2017.0, 20, 10, 10.0),
    _mark("save", 2020.0, 20, 20, 3.0, evaluation=1.0, checkpoint_save=2.0),
    _mark("end", 2024.0, 20, 20, 4.0) | {"status": "FINISHED"},
    {"event": "exit", "t": 2025.0, "launch_t": 2000.0, "status": 0},
]


def test_a_killed_attempt_then_a_finished_one_add_up_by_cause(tmp_path):
    _write(tmp_path / "run", KILLED_THEN_FINISHED)
    report = goodput(tmp_path / "run").as_dict()
    assert report["restarts"] == 1 and report["recomputed_steps"] == 4 and report["steps"] == 20
    assert report["badput_s"] == pytest.approx({
        "startup": 10.0 + 5.0, "checkpoint_load": 2.0, "checkpoint_save": 3.0 + 2.0, "evaluation": 1.0,
        "data_wait": 1.0, "recomputed": 4.0, "hung": 0.0, "lost": 5.0, "other": 4.0 + 1.0})
    assert report["productive_s"] == pytest.approx(19.0 + 8.0 + 6.0)
    assert report["wall_s"] == pytest.approx(46.0 + 25.0)  # each attempt from its launch to its exit
    assert report["productive_s"] + sum(report["badput_s"].values()) == pytest.approx(report["wall_s"])
    assert [(a["start_step"], a["end_step"], a["status"], a["progressed"]) for a in report["attempts"]] == [
        (0, 14, 1, True), (10, 20, 0, True)]
    assert set(report["badput_s"]) == set(CAUSES)


def test_steps_trained_again_after_a_divergence_rollback_are_recomputed(tmp_path):
    """One attempt: steps 0-10 in 10 s, 10-20 in 10 s, then a rollback to step 10 (its reload 2 s), steps 10-20
    again in 10 s (all 10 done before by this attempt: recomputed), 20-25 in 5 s (new: productive)."""
    _write(tmp_path / "run", [
        {"event": "start", "t": 1010.0, "step": 0, "begin_t": 1000.0, "launch_t": 1000.0, "load_s": 0.0},
        _mark("interval", 1020.0, 10, 0, 10.0), _mark("interval", 1030.0, 20, 10, 10.0),
        _mark("rollback", 1032.0, 10, 20, 2.0),
        _mark("interval", 1042.0, 20, 10, 10.0), _mark("interval", 1047.0, 25, 20, 5.0),
        {"event": "exit", "t": 1047.0, "launch_t": 1000.0, "status": 0}])
    report = goodput(tmp_path / "run").as_dict()
    assert report["restarts"] == 0 and report["recomputed_steps"] == 10
    assert report["badput_s"]["recomputed"] == pytest.approx(10.0)
    assert report["badput_s"]["checkpoint_load"] == pytest.approx(2.0)
    assert report["productive_s"] == pytest.approx(25.0)
    assert report["productive_s"] + sum(report["badput_s"].values()) == pytest.approx(report["wall_s"])


def test_a_hang_counts_the_time_to_detection_and_a_start_up_death_is_an_attempt_without_progress(tmp_path):
    events = KILLED_THEN_FINISHED[:4] + [{"event": "exit", "t": 1341.0, "launch_t": 1000.0, "status": EXIT_HUNG},
                                         {"event": "exit", "t": 1520.0, "launch_t": 1500.0, "status": 1}]
    _write(tmp_path / "run", events)
    report = goodput(tmp_path / "run")
    assert report.badput_s["hung"] == pytest.approx(300.0) and report.badput_s["lost"] == 0.0
    assert report.badput_s["startup"] == pytest.approx(10.0 + 20.0)  # the second attempt never started training
    assert report.restarts == 1 and [a.progressed for a in report.attempts] == [True, False]
    assert report.wall_s == pytest.approx(341.0 + 20.0)


def test_a_failed_end_is_lost_time_up_to_the_exit(tmp_path):
    """Rank 0 saw its peer die (a collective failed) 6 s after its last event and closed the job FAILED; the launcher
    exited 2 s later: 8 s lost, nothing in `other`."""
    events = KILLED_THEN_FINISHED[:4] + [_mark("end", 1047.0, 14, 14, 6.0) | {"status": "FAILED"},
                                         {"event": "exit", "t": 1049.0, "launch_t": 1000.0, "status": 1}]
    _write(tmp_path / "run", events)
    report = goodput(tmp_path / "run")
    assert report.badput_s["lost"] == pytest.approx(8.0) and report.badput_s["other"] == 0.0
    assert report.wall_s == pytest.approx(49.0) and report.attempts[0].status == 1


def test_without_a_launch_script_a_killed_attempt_ends_at_its_last_event_and_a_torn_line_is_skipped(tmp_path):
    run = tmp_path / "run"
    _write(run, [{k: v for k, v in e.items() if k != "launch_t"} for e in KILLED_THEN_FINISHED[:4]]
           + KILLED_THEN_FINISHED[5:9])
    with open(run / EVENTS_FILE, "a") as fh:
        fh.write('{"event": "interval", "t": 20')  # a kill during the write
    report = goodput(run)
    assert report.restarts == 1 and report.recomputed_steps == 4
    assert report.badput_s["lost"] == 0.0 and report.wall_s == pytest.approx(41.0 + 24.0)


def test_the_recorder_writes_what_goodput_reads(tmp_path, monkeypatch):
    clock = iter([0.0, 100.0, 101.0, 112.0, 115.0, 120.0])  # init, start, 3 marks, end
    monkeypatch.setenv("ALBERT_LAUNCH_TIME", "1.0")
    rec = GoodputRecorder(tmp_path, clock=lambda: next(clock))
    rec.start(0)
    rec.add("data_wait", 0.5)
    rec.mark("interval", 5)  # 1 s since start
    rec.mark("interval", 10)  # 11 s
    rec.add("checkpoint_save", 2.0)
    rec.mark("save", 10)  # 3 s
    report = rec.end(10, "FINISHED")  # 5 s, no step: other
    assert [e["event"] for e in map(json.loads, (tmp_path / EVENTS_FILE).read_text().splitlines())] == [
        "start", "interval", "interval", "save", "end"]
    assert report.productive_s == pytest.approx(0.5 + 11.0)
    assert report.badput_s["data_wait"] == 0.5 and report.badput_s["checkpoint_save"] == 2.0
    assert report.badput_s["other"] == pytest.approx(1.0 + 5.0)
    assert report.attempts[0].begin_t == 1.0 and report.metrics()["goodput/restarts"] == 0.0
    GoodputRecorder(None).start(0)  # another rank's: writes nothing


def test_goodput_of_a_directory_that_does_not_exist_is_one_line_and_exit_2(tmp_path, capsys):
    assert cli_main(["goodput", str(tmp_path / "nope"), "--json"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [f"albert-dist goodput: {tmp_path / 'nope'}: no such run directory"]


def test_goodput_of_a_directory_without_events_is_one_line_and_exit_2(tmp_path, capsys):
    """A directory that is no run (a typo one level up, a run of an older version) printed "goodput 0.0%: 0.0 s
    productive of 0.0 s wall, 0 attempt(s)" and exit 0."""
    assert cli_main(["goodput", str(tmp_path)]) == 2
    assert capsys.readouterr().err.strip().splitlines() == [
        f"albert-dist goodput: {tmp_path}: no goodput.jsonl (not a run directory, or its job never started: rank 0 "
        "and the launch scripts write it)"]


def test_goodput_json_from_the_command(tmp_path, capsys):
    _write(tmp_path / "run", KILLED_THEN_FINISHED)
    assert cli_main(["goodput", str(tmp_path / "run"), "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["restarts"] == 1 and out["wall_s"] == pytest.approx(71.0)
