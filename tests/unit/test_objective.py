"""SOP weight and its schedule (albert_dist.engine.objective): values per step, validation, config wiring."""
import pytest

from albert_dist.engine.objective import ObjectiveConfig, sop_weight_at


def test_constant_weight_from_the_first_step():
    cfg = ObjectiveConfig(sop_weight=0.1)
    assert [sop_weight_at(cfg, s) for s in (0, 1, 999)] == [0.1, 0.1, 0.1]


def test_zero_weight_is_mlm_only_at_every_step():
    cfg = ObjectiveConfig(sop_weight=0.0, sop_start_step=5, sop_ramp_steps=3)
    assert all(sop_weight_at(cfg, s) == 0.0 for s in range(20))


def test_start_step_without_ramp_is_a_step_function():
    cfg = ObjectiveConfig(sop_weight=2.0, sop_start_step=300)
    assert sop_weight_at(cfg, 299) == 0.0
    assert sop_weight_at(cfg, 300) == 2.0
    assert sop_weight_at(cfg, 10_000) == 2.0


def test_linear_ramp_after_start():
    # Ramp of 4 steps from step 10: (s - 10 + 1) / 4 of the weight, as the lr warmup counts.
    cfg = ObjectiveConfig(sop_weight=1.0, sop_start_step=10, sop_ramp_steps=4)
    assert [sop_weight_at(cfg, s) for s in range(8, 16)] == [0.0, 0.0, 0.25, 0.5, 0.75, 1.0, 1.0, 1.0]


def test_ramp_from_step_zero():
    cfg = ObjectiveConfig(sop_weight=0.5, sop_ramp_steps=2)
    assert [sop_weight_at(cfg, s) for s in range(3)] == [0.25, 0.5, 0.5]


@pytest.mark.parametrize("field, value", [("sop_weight", -0.1), ("sop_weight", float("nan")),
                                          ("sop_start_step", -1), ("sop_ramp_steps", -2)])
def test_bad_values_name_the_field(field, value):
    with pytest.raises(ValueError, match=f"objective.{field}"):
        ObjectiveConfig(**{field: value})


def test_negative_step_is_refused():
    with pytest.raises(ValueError, match="step"):
        sop_weight_at(ObjectiveConfig(), -1)


def test_objective_section_loads_strictly():
    from albert_dist.config import load_config

    cfg = load_config(None, ["objective.sop_weight=0.25", "objective.sop_start_step=7"])
    assert (cfg.objective.sop_weight, cfg.objective.sop_start_step, cfg.objective.sop_ramp_steps) == (0.25, 7, 0)
    with pytest.raises(ValueError, match="objective.sop_ramp_steps"):
        load_config(None, ["objective.sop_ramp_steps=-1"])
    with pytest.raises(ValueError, match="sop_wieght"):
        load_config(None, ["objective.sop_wieght=1"])

