"""FusedAdam: the same updates as torch.optim.Adam(fused=True), interchangeable checkpoints, no dynamo."""

from __future__ import annotations

import copy
import subprocess
import sys

import pytest
import torch

from rlinf_nb.algorithms.adam import FusedAdam


def _net(seed: int) -> torch.nn.Module:
    torch.manual_seed(seed)
    return torch.nn.Sequential(torch.nn.Linear(5, 16), torch.nn.Tanh(), torch.nn.Linear(16, 3))


def _train(net: torch.nn.Module, opt, steps: int, seed: int, lrs: list[float] | None = None) -> None:
    gen = torch.Generator().manual_seed(seed)
    for t in range(steps):
        if lrs is not None:
            opt.param_groups[0]["lr"] = lrs[t]
        x = torch.randn(32, 5, generator=gen)
        y = torch.randn(32, 3, generator=gen)
        opt.zero_grad(set_to_none=True)
        torch.nn.functional.mse_loss(net(x), y).backward()
        opt.step()


@pytest.mark.parametrize("weight_decay", [0.0, 0.01])
def test_updates_equal_torch_fused_adam_step_by_step(weight_decay):
    ours, theirs = _net(0), _net(0)
    lrs = [3e-3 * (1 - t / 40) for t in range(40)]  # a decaying rate, set through param_groups as learners do
    _train(ours, FusedAdam(ours.parameters(), lr=3e-3, eps=1e-5, weight_decay=weight_decay), 40, 1, lrs)
    _train(theirs, torch.optim.Adam(theirs.parameters(), lr=3e-3, eps=1e-5, weight_decay=weight_decay,
                                    fused=True), 40, 1, lrs)  # fmt: skip
    for a, b in zip(ours.parameters(), theirs.parameters(), strict=True):
        torch.testing.assert_close(a, b, rtol=0, atol=0)
    assert any(
        (p - q).abs().max() > 1e-3 for p, q in zip(ours.parameters(), _net(0).parameters(), strict=True)
    )


def test_checkpoints_load_into_either_optimiser():
    """Train 10 steps, save, load into the other class, train 10 more: both continue identically.

    The state dicts are deep-copied, as a checkpoint on disk would be (both classes hand out their
    live tensors, as torch.optim does)."""
    a_net, b_net = _net(1), _net(1)
    a = FusedAdam(a_net.parameters(), lr=1e-2)
    _train(a_net, a, 10, 2)
    b_net.load_state_dict(a_net.state_dict())
    b = torch.optim.Adam(b_net.parameters(), lr=0.5, fused=True)  # lr comes from the checkpoint
    b.load_state_dict(copy.deepcopy(a.state_dict()))
    assert b.param_groups[0]["lr"] == 1e-2
    _train(a_net, a, 10, 3)
    _train(b_net, b, 10, 3)
    for p, q in zip(a_net.parameters(), b_net.parameters(), strict=True):
        torch.testing.assert_close(p, q, rtol=0, atol=0)
    c_net = _net(5)
    c_net.load_state_dict(b_net.state_dict())
    c = FusedAdam(c_net.parameters())
    c.load_state_dict(copy.deepcopy(b.state_dict()))  # torch.optim's state dict, back into ours
    assert float(c.state_dict()["state"][0]["step"]) == 20.0
    _train(b_net, b, 5, 4)
    _train(c_net, c, 5, 4)
    for p, q in zip(b_net.parameters(), c_net.parameters(), strict=True):
        torch.testing.assert_close(p, q, rtol=0, atol=0)


def test_bad_input_is_refused_with_what_is_wrong():
    with pytest.raises(ValueError, match="no parameters"):
        FusedAdam([])
    with pytest.raises(TypeError, match="float tensors"):
        FusedAdam([torch.zeros(3, dtype=torch.int64)])
    opt = FusedAdam(_net(0).parameters())
    with pytest.raises(ValueError, match="one group of 4 parameters"):
        opt.load_state_dict(torch.optim.Adam(torch.nn.Linear(2, 2).parameters()).state_dict())


def test_a_ppo_update_does_not_import_dynamo():
    """The reason FusedAdam exists: torch.optim imports torch._dynamo (a second or more) on first use,
    on the critical path of a launch whose learner lives in the controller. PPO's learner never does."""
    code = (
        "import sys, numpy as np, gymnasium as gym\n"
        "from rlinf_nb.algorithms.registry import get_algorithm\n"
        "from rlinf_nb.policies import make_policy\n"
        "ppo = get_algorithm('ppo')\n"
        "assert ppo.learner_imports == ()\n"
        "env = gym.make('CartPole-v1')\n"
        "policy = make_policy('mlp', env.observation_space, env.action_space, hidden_sizes=[16])\n"
        "cfg = ppo.config_cls(minibatch_size=8, epochs=2)\n"
        "learner = ppo.make_learner(policy, cfg, seed=0)\n"
        "rng = np.random.default_rng(0)\n"
        "f = lambda *shape: rng.standard_normal(shape).astype(np.float32)\n"
        "batch = {'obs': f(4, 4, 4), 'actions': rng.integers(0, 2, (4, 4)), 'logprobs': f(4, 4) - 1,\n"
        "         'values': f(4, 4), 'advantages': f(4, 4), 'returns': f(4, 4)}\n"
        "out = learner.update(batch, cfg, 0.0)\n"
        "assert np.isfinite(out['policy_loss'])\n"
        "learner.load_state_dict(learner.state_dict())\n"
        "print('torch._dynamo' in sys.modules)\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True
    )
    assert out.stdout.strip() == "False"
