"""Single-process checks of albert_dist.engine.lamb against LAMB re-implemented here from the paper.

Reference: You et al. 2019, "Large Batch Optimization for Deep Learning", Algorithm 2 (LAMB), with bias
correction, decoupled weight decay inside the trust-ratio denominator, and trust ratio 1 when a norm is 0.
"""
from __future__ import annotations

import math

import pytest
import torch
from torch import nn

from albert_dist.engine.lamb import FlatPartitionMap, Lamb
from albert_dist.engine.optim import build_lamb, lamb_param_groups


def reference_lamb(weights, grads_per_step, lr, betas, eps, wd, adapt):
    """Paper equations in float64 on lists of tensors; returns the weights after len(grads_per_step) steps."""
    b1, b2 = betas
    w = [x.double().clone() for x in weights]
    m = [torch.zeros_like(x) for x in w]
    v = [torch.zeros_like(x) for x in w]
    for t, grads in enumerate(grads_per_step, start=1):
        for i, g in enumerate(grads):
            g = g.double()
            m[i] = b1 * m[i] + (1 - b1) * g
            v[i] = b2 * v[i] + (1 - b2) * g * g
            m_hat = m[i] / (1 - b1 ** t)
            v_hat = v[i] / (1 - b2 ** t)
            r = m_hat / (v_hat.sqrt() + eps) + wd[i] * w[i]
            wn, rn = w[i].norm().item(), r.norm().item()
            ratio = wn / rn if (adapt[i] and wn > 0 and rn > 0) else 1.0
            w[i] = w[i] - lr * ratio * r
    return w


def _tensors(seed=0):
    gen = torch.Generator().manual_seed(seed)
    shapes = [(7, 5), (13,), (3, 4, 2), (6,)]
    weights = [torch.randn(s, generator=gen) * 0.2 for s in shapes]
    weights.append(torch.zeros(4))  # ||w|| = 0 -> trust ratio 1
    grads = [[torch.randn(w.shape, generator=gen) * 10 ** (k - 2) for k, w in enumerate(weights)]
             for _ in range(4)]
    return weights, grads


def test_lamb_matches_paper_equations_per_tensor():
    weights, grads = _tensors()
    wd = [0.01, 0.0, 0.01, 0.0, 0.01]
    adapt = [True, False, True, False, True]
    params = [nn.Parameter(w.clone()) for w in weights]
    opt = Lamb([{"params": [params[0], params[2], params[4]]},
                {"params": [params[1], params[3]], "weight_decay": 0.0, "layer_adaptation": False}],
               lr=0.02, betas=(0.9, 0.999), eps=1e-6, weight_decay=0.01)
    for step_grads in grads:
        for p, g in zip(params, step_grads):
            p.grad = g.clone()
        opt.step()
    expected = reference_lamb(weights, grads, 0.02, (0.9, 0.999), 1e-6, wd, adapt)
    for i, (p, e) in enumerate(zip(params, expected)):
        torch.testing.assert_close(p.detach().double(), e, rtol=1e-5, atol=1e-7, msg=f"tensor {i}")
    assert opt.state[params[0]]["step"].item() == 4.0
    assert set(opt.state[params[0]]) == {"step", "exp_avg", "exp_avg_sq"}


def test_flat_partition_with_map_equals_per_tensor_lamb():
    """One flat tensor holding fragments (with alignment gaps) + a map gives the per-tensor result."""
    weights, grads = _tensors(1)
    # layout: [gap 2][w0 35][w2 24][gap 3][w3 6][w1 13][w4 4][gap 5]
    order, gaps_before = [0, 2, 3, 1, 4], [2, 0, 3, 0, 0]
    starts, pos = {}, 0
    for i, gap in zip(order, gaps_before):
        pos += gap
        starts[i] = pos
        pos += weights[i].numel()
    numel = pos + 5
    flat = torch.zeros(numel)
    for i in order:
        flat[starts[i]:starts[i] + weights[i].numel()] = weights[i].flatten()
    flat = nn.Parameter(flat)
    opt = Lamb([flat], lr=0.02, weight_decay=0.01)
    pmap = FlatPartitionMap(slots=tuple(order), starts=tuple(starts[i] for i in order),
                            numels=tuple(weights[i].numel() for i in order), num_params=5, numel=numel,
                            process_group=None, world_size=1)
    opt.set_partition_resolver(lambda p: pmap if p is flat else None)
    for step_grads in grads:
        g = torch.zeros(numel)
        for i in order:
            g[starts[i]:starts[i] + weights[i].numel()] = step_grads[i].flatten()
        flat.grad = g
        opt.step()
    expected = reference_lamb(weights, grads, 0.02, (0.9, 0.999), 1e-6, [0.01] * 5, [True] * 5)
    for i in order:
        got = flat.detach()[starts[i]:starts[i] + weights[i].numel()].view(weights[i].shape)
        torch.testing.assert_close(got.double(), expected[i], rtol=1e-5, atol=1e-7, msg=f"tensor {i}")
    gaps = torch.ones(numel, dtype=torch.bool)
    for i in order:
        gaps[starts[i]:starts[i] + weights[i].numel()] = False
    assert torch.all(flat.detach()[gaps] == 0)
    # Control: the same flat tensor without a map is one tensor to LAMB, and the result differs.
    naive = nn.Parameter(torch.zeros(numel))
    with torch.no_grad():
        for i in order:
            naive[starts[i]:starts[i] + weights[i].numel()] = weights[i].flatten()
    naive_opt = Lamb([naive], lr=0.02, weight_decay=0.01)
    for step_grads in grads:
        g = torch.zeros(numel)
        for i in order:
            g[starts[i]:starts[i] + weights[i].numel()] = step_grads[i].flatten()
        naive.grad = g
        naive_opt.step()
    assert not torch.allclose(naive.detach(), flat.detach(), rtol=1e-3)


def test_foreign_flat_tensor_without_map_raises():
    p = nn.Parameter(torch.randn(10))
    opt = Lamb([p], lr=0.01)
    flat = nn.Parameter(torch.randn(6))  # what a DeepSpeed wrapper puts into param_groups
    opt.param_groups[0]["params"] = [flat]
    flat.grad = torch.randn(6)
    with pytest.raises(RuntimeError, match="attach_zero_partition_map"):
        opt.step()


@pytest.mark.parametrize("kwargs, field", [({"lr": 0.0}, "lr"), ({"betas": (0.9, 1.0)}, "betas"),
                                           ({"eps": 0.0}, "eps"), ({"weight_decay": -0.1}, "weight_decay")])
def test_bad_hyperparameters_raise(kwargs, field):
    with pytest.raises(ValueError, match=field):
        Lamb([nn.Parameter(torch.zeros(2))], **kwargs)


def test_map_validation_rejects_overlap():
    with pytest.raises(ValueError, match="overlaps"):
        FlatPartitionMap(slots=(0, 1), starts=(0, 3), numels=(4, 2), num_params=2, numel=8,
                         process_group=None, world_size=1)


def test_build_lamb_excludes_no_decay_group_from_decay_and_adaptation():
    from albert_dist.engine.config import OptimConfig
    from albert_dist.engine.optim import param_groups

    model = nn.Sequential(nn.Linear(4, 3), nn.LayerNorm(3))
    cfg = OptimConfig(type="lamb", lr=0.00176, weight_decay=0.01, eps=1e-6)
    groups = param_groups(model, cfg.weight_decay)
    opt = build_lamb(groups, cfg)
    by_nodecay = {g["no_decay"]: g for g in opt.param_groups}
    assert by_nodecay[False]["weight_decay"] == 0.01 and by_nodecay[False]["layer_adaptation"] is True
    assert by_nodecay[True]["weight_decay"] == 0.0 and by_nodecay[True]["layer_adaptation"] is False
    assert math.isclose(opt.defaults["lr"], 0.00176) and opt.defaults["eps"] == 1e-6
    assert groups[1].get("layer_adaptation") is None  # input not mutated
    assert lamb_param_groups([{"params": [], "no_decay": True, "weight_decay": 0.3}])[0]["weight_decay"] == 0.0


def test_wrapper_state_creation_step_does_not_move_weights():
    """DeepSpeed's FP16_UnfusedOptimizer steps its fp32 copies once with zero gradients inside
    deepspeed.initialize; LAMB only creates state there, so the run still follows the paper's equations."""
    weights, grads = _tensors(2)
    weights = weights[:4]
    own = [nn.Parameter(w.clone()) for w in weights]
    opt = Lamb(own, lr=0.02, weight_decay=0.01)
    copies = [nn.Parameter(w.clone()) for w in weights]  # what the wrapper puts into param_groups
    opt.param_groups[0]["params"] = copies
    for c in copies:
        c.grad = torch.zeros_like(c)
    opt.step()  # no map attached yet, as inside deepspeed.initialize
    for c, w in zip(copies, weights):
        assert torch.equal(c.detach(), w)
        assert opt.state[c]["step"].item() == 0.0
    opt.set_partition_resolver(None)  # what attach_zero_partition_map does for this wrapper
    for step_grads in grads:
        for c, g in zip(copies, step_grads):
            c.grad = g.clone()
        opt.step()
    expected = reference_lamb(weights, [g[:4] for g in grads], 0.02, (0.9, 0.999), 1e-6, [0.01] * 4, [True] * 4)
    for i, (c, e) in enumerate(zip(copies, expected)):
        torch.testing.assert_close(c.detach().double(), e, rtol=1e-5, atol=1e-7, msg=f"tensor {i}")
