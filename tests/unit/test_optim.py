"""ALBERT parameter groups, AdamW and the warmup + decay schedule, against re-implemented equations."""
from __future__ import annotations

import math

import pytest
import torch
from torch import nn

from albert_dist.engine.config import OptimConfig
from albert_dist.engine.optim import build_optimizer, build_scheduler, lr_factor, param_groups
from albert_dist.model import AlbertConfig, AlbertForPreTraining

TINY = AlbertConfig(vocab_size=50, embedding_size=8, hidden_size=16, num_hidden_layers=3, num_hidden_groups=2,
                    num_attention_heads=2, intermediate_size=32, max_position_embeddings=16)


def test_groups_exclude_layernorm_and_bias_and_hold_each_param_once():
    model = AlbertForPreTraining(TINY)
    groups = param_groups(model, weight_decay=0.1)
    decay, no_decay = groups
    assert decay["weight_decay"] == 0.1 and no_decay["weight_decay"] == 0.0
    assert not decay["no_decay"] and no_decay["no_decay"]
    # Independent classification from names: LayerNorm modules and biases.
    ln_params = {id(p) for m in model.modules() if isinstance(m, nn.LayerNorm) for p in m.parameters()}
    for name, p in zip(decay["names"], decay["params"]):
        assert not name.endswith("bias") and id(p) not in ln_params, name
    for name, p in zip(no_decay["names"], no_decay["params"]):
        assert name.endswith("bias") or id(p) in ln_params, name
    # Every unique parameter exactly once (tied decoder / word embeddings counted once).
    all_ids = [id(p) for g in groups for p in g["params"]]
    assert len(all_ids) == len(set(all_ids)) == len({id(p) for p in model.parameters()})
    assert any("LayerNorm" in n or "layer_norm" in n for n in no_decay["names"])


def test_frozen_parameters_are_left_out():
    model = nn.Sequential(nn.Linear(3, 3), nn.LayerNorm(3))
    model[0].weight.requires_grad_(False)
    names = [n for g in param_groups(model, 0.1) for n in g["names"]]
    assert names == ["0.bias", "1.weight", "1.bias"]


def test_adamw_step_matches_the_equations():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 3), nn.LayerNorm(3))
    cfg = OptimConfig(lr=0.1, weight_decay=0.5, betas=[0.9, 0.99], eps=1e-6)
    opt = build_optimizer(model, cfg).optimizer
    w0, b0 = model[0].weight.detach().clone(), model[0].bias.detach().clone()
    model(torch.randn(5, 4)).pow(2).sum().backward()
    gw, gb = model[0].weight.grad.clone(), model[0].bias.grad.clone()
    opt.step()

    def adamw(p, g, wd):  # Loshchilov & Hutter, Algorithm 2, first step (bias-corrected moments = g, g^2)
        m_hat = (1 - 0.9) * g / (1 - 0.9)
        v_hat = (1 - 0.99) * g * g / (1 - 0.99)
        return p * (1 - 0.1 * wd) - 0.1 * m_hat / (v_hat.sqrt() + 1e-6)

    torch.testing.assert_close(model[0].weight.detach(), adamw(w0, gw, 0.5), rtol=1e-6, atol=1e-7)
    torch.testing.assert_close(model[0].bias.detach(), adamw(b0, gb, 0.0), rtol=1e-6, atol=1e-7)


@pytest.mark.parametrize("decay, power", [("linear", 1.0), ("polynomial", 2.0), ("polynomial", 0.5)])
def test_schedule_warmup_then_decay_to_zero(decay, power):
    warmup, total, peak = 4, 12, 0.2
    model = nn.Linear(2, 2)
    cfg = OptimConfig(lr=peak, warmup_steps=warmup, decay=decay, power=power, weight_decay=0.0)
    opt = build_optimizer(model, cfg).optimizer
    sched = build_scheduler(opt, cfg, total)
    seen = []
    for _ in range(total):
        seen.append(opt.param_groups[0]["lr"])
        opt.step()
        sched.step()
    expected = [peak * (s + 1) / warmup if s < warmup else peak * ((total - s) / (total - warmup)) ** power
                for s in range(total)]
    assert seen == pytest.approx(expected, rel=1e-12)
    assert seen[warmup - 1] == pytest.approx(peak)  # peak reached at the end of warmup
    assert opt.param_groups[0]["lr"] == 0.0  # decayed to 0 after the last step
    assert all(a >= b for a, b in zip(seen[warmup - 1:], seen[warmup:]))  # monotone decay


def test_no_warmup_starts_at_peak():
    assert lr_factor(0, 0, 10) == 1.0
    assert lr_factor(5, 0, 10, "polynomial", 2.0) == pytest.approx(0.25)
    assert lr_factor(10, 0, 10) == 0.0


def test_schedule_errors():
    with pytest.raises(ValueError, match="warmup_steps"):
        lr_factor(0, 20, 10)
    with pytest.raises(ValueError, match="total_steps"):
        lr_factor(0, 0, 0)


@pytest.mark.parametrize("field, value", [("lr", 0.0), ("weight_decay", -0.1), ("betas", [0.9]),
                                          ("betas", [0.9, 1.0]), ("eps", 0.0), ("warmup_steps", -1),
                                          ("type", "sgd"), ("decay", "cosine"), ("power", 0.0)])
def test_optim_config_validation(field, value):
    with pytest.raises(ValueError, match=f"optimizer.{field}"):
        OptimConfig(**{field: value})


def test_lamb_is_built_from_the_lamb_module():
    from albert_dist.engine import lamb  # a broken import must fail here, not skip

    model = AlbertForPreTraining(TINY)
    opt = build_optimizer(model, OptimConfig(type="lamb", lr=1.76e-3)).optimizer
    assert isinstance(opt, lamb.Lamb)
    assert sum(len(g["params"]) for g in opt.param_groups) == len(list(model.parameters()))
    assert not math.isnan(opt.param_groups[0]["lr"])
