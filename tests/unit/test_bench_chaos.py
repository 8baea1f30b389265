"""bench/chaos.py's pure parts: the fault schedule (and its rule around a rollback), when a fault may be injected,
the time each fault cost from a run's goodput events, and the tensor-by-tensor weights comparison. The soak itself
(processes, faults, ~8 min) is not in the suite: `python bench/chaos.py`."""
from __future__ import annotations

import pytest
import torch

from tests.helpers import load_bench

C = load_bench("chaos")


def test_the_default_schedule_has_every_fault_once_in_step_order():
    faults = C.parse_faults(C.DEFAULT_FAULTS, 10, C.DEFAULT_STEPS)
    assert sorted(f for f, _ in faults) == sorted(C.FAULTS)
    assert [s for _, s in faults] == sorted(s for _, s in faults)
    assert C.parse_faults("preempt@35, kill9@15", 10, 60) == [("kill9", 15), ("preempt", 35)]


@pytest.mark.parametrize("text, says", [
    ("kill9@15,boom@3", "unknown fault 'boom'"),
    ("kill9@0", "expected <fault>@<step >= 1>"),
    ("kill9@x", "expected <fault>@<step >= 1>"),
    ("kill9@60", "the run has 60 steps"),
    ("diverge@20,diverge@40", "one diverge at most"),
    ("diverge@11", "no checkpoint to roll back to"),
    # diverge@57 rolls back to step 50; the first checkpoint at or after 57 is step 60
    ("preempt@48,diverge@57", "preempt@48 would change diverge@57's rollback (to step 50): put it at step 47 or "
                              "before, or 63 or after"),
    ("kill9@59,diverge@57", "kill9@59 would change"),
])
def test_a_bad_schedule_is_one_error_naming_the_fault(text, says):
    with pytest.raises(ValueError, match="^--faults: ") as err:
        C.parse_faults(text, 10, 60)
    assert says in str(err.value)


def test_faults_clear_of_the_rollback_pass():
    assert C.parse_faults("preempt@47,kill9@63,diverge@57", 10, 70) == [("preempt", 47), ("diverge", 57),
                                                                        ("kill9", 63)]


@pytest.mark.parametrize("save_every", [1, 3, 10])
@pytest.mark.parametrize("flagged", range(2, 40))
def test_the_rollback_target_is_the_newest_checkpoint_before_the_one_step_f_measures(flagged, save_every):
    # docs/faults.md: flagged first at step F, the checkpoints of steps >= F-1 are diverged
    healthy = [c for c in range(save_every, flagged, save_every) if c < flagged - 1]
    assert C.rollback_target(flagged, save_every) == max(healthy, default=0)


def test_a_fault_waits_until_the_current_attempt_has_reached_its_step():
    def step(n):
        return {"event": "interval", "step": n}

    start, exit_ = {"event": "start", "step": 10}, {"event": "exit"}
    assert C.attempt_step([]) is None
    assert C.attempt_step([start]) is None  # in start-up: a SIGTERM there saves nothing
    assert C.attempt_step([start, step(11), step(12)]) == 12
    first = [{"event": "start", "step": 0}, *map(step, range(1, 23)), exit_]
    assert C.attempt_step(first) is None  # the launcher's end: the next attempt is not up yet
    # the restarted attempt is at step 14 although the run once reached 22 (a kill lands steps late)
    assert C.attempt_step([*first, start]) is None
    assert C.attempt_step([*first, start, step(11), step(14)]) == 14


def _ev(kind, t, step):
    return {"event": kind, "t": float(t), "step": step}


def test_fault_costs_from_goodput_events():
    events = [
        # attempt 1: steps 1-12, checkpoint at 10, killed after step 12's event (t 112)
        _ev("start", 100, 0), *(_ev("interval", 100 + s, s) for s in range(1, 13)), _ev("save", 110.5, 10),
        _ev("exit", 130, None),
        # attempt 2: resumed from 10 at t 170, back at step 12 at t 172; preempted after step 20 (t 180)
        _ev("start", 170, 10), *(_ev("interval", 160 + s, s) for s in range(11, 21)), _ev("save", 180.5, 20),
        _ev("end", 181, 20), _ev("exit", 182, None),
        # attempt 3: resumed from the stop checkpoint of step 20 at t 230; diverged, read at step 27 (t 237),
        # rolled back to 20: step 21 again at t 240, step 27 again at t 246
        _ev("start", 230, 20), *(_ev("interval", 210 + s, s) for s in range(21, 28)),
        *(_ev("interval", 219 + s, s) for s in range(21, 31)), _ev("end", 250, 30), _ev("exit", 251, None),
    ]
    injected = [{"fault": "kill9", "seen_step": 12}, {"fault": "preempt", "seen_step": 20},
                {"fault": "diverge", "seen_step": 27}]
    costs = C.fault_costs(events, injected)
    assert costs == [
        {"fault": "kill9", "step": 12, "last_step": 12, "recomputed_steps": 2, "cost_s": 172 - 112},
        {"fault": "preempt", "step": 20, "last_step": 20, "recomputed_steps": 0, "cost_s": 230 - 180},
        {"fault": "diverge", "step": 27, "last_step": 27, "recomputed_steps": 7, "cost_s": 246 - 237}]
    with pytest.raises(ValueError, match="3 faults ended an attempt, but the events hold 3 attempts"):
        C.fault_costs(events, [{"fault": "kill9"}, {"fault": "sigstop"}, {"fault": "store_outage"}])


def test_compare_weights_is_bit_for_bit_and_names_what_differs(tmp_path):
    from safetensors.torch import save_file

    a = {"w": torch.linspace(-1, 1, 12).reshape(3, 4), "b": torch.zeros(4)}
    save_file(a, str(tmp_path / "a.safetensors"))
    save_file({k: v.clone() for k, v in a.items()}, str(tmp_path / "same.safetensors"))
    nudged = a["w"].clone()
    nudged[1, 2] = torch.nextafter(nudged[1, 2], torch.tensor(2.0))  # one ulp
    save_file({"w": nudged, "b": a["b"]}, str(tmp_path / "nudged.safetensors"))
    save_file({"w": a["w"]}, str(tmp_path / "fewer.safetensors"))

    same = C.compare_weights(tmp_path / "a.safetensors", tmp_path / "same.safetensors")
    assert same == {"equal": True, "tensors": 2, "elements": 16, "differ": [], "max_abs_diff": 0.0}
    off = C.compare_weights(tmp_path / "a.safetensors", tmp_path / "nudged.safetensors")
    assert not off["equal"] and off["differ"] == ["w"]
    assert off["max_abs_diff"] == pytest.approx(abs(nudged[1, 2].item() - a["w"][1, 2].item())) and off["max_abs_diff"] > 0
    fewer = C.compare_weights(tmp_path / "a.safetensors", tmp_path / "fewer.safetensors")
    assert not fewer["equal"] and fewer["differ"] == ["b"]
