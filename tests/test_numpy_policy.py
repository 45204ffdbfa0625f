"""The mlp policy's numpy copy (rlinf_nb.policies.numpy_mlp) against the torch policy it mirrors."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import gymnasium as gym
import numpy as np
import pytest
import torch
from rlinf_nb.runtime.inference import PolicyServer, TorchActing, make_acting

from rlinf_nb.config import ConfigError, build
from rlinf_nb.policies import make_policy
from rlinf_nb.policies.numpy_mlp import NumpyMLPPolicy, numpy_policy, numpy_support
from rlinf_nb.run_config import RunConfig, policy_kwargs

OBS = gym.spaces.Box(-np.inf, np.inf, (5,), np.float32)
SPACES = {
    "categorical": gym.spaces.Discrete(4),
    "gaussian": gym.spaces.Box(-1.0, 1.0, (3,), np.float32),
    "squashed_gaussian": gym.spaces.Box(np.array([-2.0, 0.0, -1.0], np.float32),
                                        np.array([2.0, 1.0, 3.0], np.float32)),
}  # fmt: skip


def _pair(head: str, seed: int = 0, chunk: int = 1, **kwargs):
    """A torch policy with perturbed weights and its numpy copy loaded from the same state_dict."""
    cfg = {"name": "mlp", "kwargs": {"hidden_sizes": [16, 8], "action_head": head, **kwargs}, "chunk": chunk}
    torch.manual_seed(seed)
    policy = make_policy("mlp", OBS, SPACES[head], **policy_kwargs(cfg))
    with torch.no_grad():  # away from the init (zero biases, 0.01 heads), so every term matters
        for p in policy.parameters():
            p.add_(0.3 * torch.randn_like(p))
    weights = {k: v.detach().numpy().copy() for k, v in policy.state_dict().items()}
    copy = numpy_policy(cfg, OBS, SPACES[head], seed)
    assert copy is not None
    copy.load(weights)
    return policy, copy


@pytest.mark.parametrize("head", list(SPACES))
@pytest.mark.parametrize("chunk", [1, 3])
@pytest.mark.parametrize("activation", ["tanh", "relu", "elu", "silu", "leaky_relu"])
def test_values_and_log_probs_match_the_torch_policy(head, chunk, activation):
    policy, copy = _pair(head, chunk=chunk, activation=activation)
    obs = np.random.default_rng(1).normal(size=(32, 5)).astype(np.float32)
    action, logprob, value = copy.act(obs)
    with torch.no_grad():
        t_logprob, _, t_value = policy.evaluate(torch.as_tensor(obs), torch.as_tensor(action))
    np.testing.assert_allclose(value, t_value.numpy(), rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(copy.value(obs), t_value.numpy(), rtol=1e-5, atol=1e-5)
    # the learner's log-prob of the copy's action is the one the copy reported (PPO's ratio starts at 1)
    ok = np.ones(len(obs), bool)
    if head == "squashed_gaussian":  # torch scores a squashed action through atanh: imprecise near the bounds
        space = SPACES[head]
        y = (action.reshape(len(obs), -1, 3) - (space.high + space.low) / 2) / ((space.high - space.low) / 2)
        ok = (np.abs(y) < 0.999).all(axis=(1, 2))
        assert ok.sum() >= 8
    np.testing.assert_allclose(logprob[ok], t_logprob.numpy()[ok], rtol=1e-4, atol=1e-4)
    with torch.no_grad():
        t_action, _, _ = policy.act(torch.as_tensor(obs))
    assert action.shape == t_action.shape and action.dtype == t_action.numpy().dtype
    assert logprob.dtype == np.float32 and value.dtype == np.float32 and logprob.shape == (32,)


def test_a_shared_trunk_reads_the_same_layers_for_both_heads():
    policy, copy = _pair("gaussian", share_trunk=True)
    obs = np.random.default_rng(2).normal(size=(8, 5)).astype(np.float32)
    with torch.no_grad():
        np.testing.assert_allclose(copy.value(obs), policy.value(torch.as_tensor(obs)).numpy(), atol=1e-5)


def test_samples_follow_the_torch_distributions():
    n = 20_000
    obs = np.zeros((n, 5), np.float32) + 0.3  # one observation, repeated
    policy, copy = _pair("categorical")
    actions, _, _ = copy.act(obs)
    with torch.no_grad():
        probs = policy.distribution(torch.as_tensor(obs[:1])).probs.numpy()[0]
    np.testing.assert_allclose(np.bincount(actions, minlength=4) / n, probs, atol=0.015)

    policy, copy = _pair("gaussian")
    actions, _, _ = copy.act(obs)
    with torch.no_grad():
        dist = policy.distribution(torch.as_tensor(obs[:1]))
    np.testing.assert_allclose(
        actions.mean(0), dist.mean.detach().numpy()[0], atol=0.05 * dist.std.detach().numpy().max()
    )
    np.testing.assert_allclose(actions.std(0), dist.std.detach().numpy()[0], rtol=0.05)

    _, copy = _pair("squashed_gaussian")
    actions, _, _ = copy.act(obs)
    space = SPACES["squashed_gaussian"]
    assert (actions >= space.low).all() and (actions <= space.high).all()
    assert actions.std(0).min() > 0  # it samples, not the mode


@pytest.mark.parametrize("head", list(SPACES))
@pytest.mark.parametrize("chunk", [1, 3])
def test_deterministic_acting_gives_the_torch_mode_and_its_log_prob(head, chunk):
    policy, copy = _pair(head, chunk=chunk)
    obs = np.random.default_rng(4).normal(size=(16, 5)).astype(np.float32)
    action, logprob, _ = copy.act(obs, deterministic=True)
    with torch.no_grad():
        t_action, t_logprob, _ = policy.act(torch.as_tensor(obs), deterministic=True)
    np.testing.assert_allclose(action, t_action.numpy(), rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(logprob, t_logprob.numpy(), rtol=1e-4, atol=1e-4)
    np.testing.assert_array_equal(copy.act(obs, deterministic=True)[0], action)  # no draw: the same again
    assert not np.array_equal(copy.act(obs)[0], action)  # sampling still samples


def test_a_server_answers_mode_requests_with_the_policys_mode():
    env = gym.make("Pendulum-v1")
    for backend in ("numpy", "torch"):
        cfg = {"name": "mlp", "kwargs": {"hidden_sizes": [8], "log_std_init": 0.0}, "inference": backend}
        server = PolicyServer(cfg, env.observation_space, env.action_space, 3)
        torch_policy = make_policy("mlp", env.observation_space, env.action_space, **policy_kwargs(cfg))
        server.set_weights({k: v.numpy() for k, v in torch_policy.state_dict().items()}, 0)
        obs = np.random.default_rng(0).normal(size=(32, 3)).astype(np.float32)
        msg = {"obs": obs, "sender": 0, "final_obs": None, "final_mask": None, "value_only": False}
        mode = server.answer([{**msg, "acting": "mode"}])[0]["actions"]
        np.testing.assert_array_equal(server.answer([{**msg, "acting": "mode"}])[0]["actions"], mode)
        sampled = server.answer([msg])[0]["actions"]
        assert np.abs(sampled - mode).mean() > 0.3  # std 1 around the same mean
        with pytest.raises(ValueError, match="acting: got 'greedy'; allowed values: sample, mode, random"):
            server.answer([{**msg, "acting": "greedy"}])


def test_the_same_seed_gives_the_same_actions():
    _, a = _pair("gaussian", seed=5)
    _, b = _pair("gaussian", seed=5)
    obs = np.ones((4, 5), np.float32)
    np.testing.assert_array_equal(a.act(obs)[0], b.act(obs)[0])
    assert not np.array_equal(a.act(obs)[0], a.act(obs)[0])  # a stream, not a fixed draw


def test_acting_before_any_weights_says_so():
    copy = numpy_policy({"name": "mlp"}, OBS, SPACES["gaussian"], 0)
    with pytest.raises(RuntimeError, match="no weights yet"):
        copy.act(np.zeros((1, 5), np.float32))


def test_weights_of_another_shape_name_the_missing_key():
    copy = numpy_policy({"name": "mlp", "kwargs": {"action_head": "squashed_gaussian"}}, OBS,
                        SPACES["squashed_gaussian"], 0)  # fmt: skip
    gaussian, _ = _pair("gaussian")
    with pytest.raises(KeyError, match="actor_head.log_std.weight"):
        copy.load({k: v.detach().numpy() for k, v in gaussian.state_dict().items()})


def test_which_policies_have_a_numpy_copy():
    image_obs = gym.spaces.Dict({"rgb": gym.spaces.Box(0, 255, (8, 8, 3), np.uint8)})
    assert numpy_support({"name": "mlp"}, OBS, SPACES["gaussian"]) is None
    assert "only 'mlp'" in numpy_support({"name": "cnn"}, image_obs, SPACES["gaussian"])
    assert "not a Box" in numpy_support({"name": "mlp"}, image_obs, SPACES["gaussian"])
    assert "'gelu'" in numpy_support(
        {"name": "mlp", "kwargs": {"activation": "gelu"}}, OBS, SPACES["gaussian"]
    )
    gelu = {"name": "mlp", "kwargs": {"activation": "gelu"}}
    assert isinstance(make_acting(gelu, OBS, SPACES["gaussian"], 0), TorchActing)  # auto falls back
    assert isinstance(make_acting({"name": "mlp"}, OBS, SPACES["gaussian"], 0), NumpyMLPPolicy)
    assert isinstance(
        make_acting({"name": "mlp", "inference": "torch"}, OBS, SPACES["gaussian"], 0), TorchActing
    )
    with pytest.raises(
        ValueError, match=r"policy\.inference: numpy is not available for this policy: activation 'gelu'"
    ):
        make_acting({**gelu, "inference": "numpy"}, OBS, SPACES["gaussian"], 0)


def test_the_config_refuses_numpy_inference_for_a_policy_without_a_copy():
    with pytest.raises(ConfigError, match=r"policy\.inference.*'cnn' has no numpy copy"):
        build(RunConfig, {"policy": {"name": "cnn", "inference": "numpy"}})
    with pytest.raises(
        ConfigError, match=r"policy\.inference: got 'jax'; allowed values: 'auto', 'torch', 'numpy'"
    ):
        build(RunConfig, {"policy": {"inference": "jax"}})


def test_a_numpy_server_answers_like_the_torch_server_scores_it():
    env = gym.make("CartPole-v1")
    cfg = {"name": "mlp", "kwargs": {"hidden_sizes": [8]}}
    torch_server = PolicyServer({**cfg, "inference": "torch"}, env.observation_space, env.action_space, 0)
    server = PolicyServer(cfg, env.observation_space, env.action_space, 0)
    assert isinstance(server.policy, NumpyMLPPolicy)
    weights = {k: v.numpy() for k, v in torch_server.policy.state_dict().items()}
    server.offer_weights(weights, 4)
    torch_server.set_weights(weights, 4)
    obs = np.random.default_rng(3).normal(size=(6, 4)).astype(np.float32)
    final = obs[:2] + 1
    msg = {"obs": obs, "sender": 0, "final_obs": final, "final_mask": None, "value_only": False}
    reply, t_reply = server.answer([msg])[0], torch_server.answer([msg])[0]
    assert (reply["version"] == 4).all()
    np.testing.assert_allclose(reply["values"], t_reply["values"], atol=1e-6)
    np.testing.assert_allclose(reply["bootstrap_values"], t_reply["bootstrap_values"], atol=1e-6)
    with torch.no_grad():
        logprob, _, _ = torch_server.policy.evaluate(torch.as_tensor(obs), torch.as_tensor(reply["actions"]))
    np.testing.assert_allclose(reply["logprobs"], logprob.numpy(), atol=1e-5)


def test_an_env_worker_with_a_numpy_policy_never_imports_torch():
    """What makes a CartPole env worker start fast: it builds its env and policy and acts, torch-free."""
    code = textwrap.dedent(
        """
        import sys
        import numpy as np
        from rlinf_nb.envs import make_env
        from rlinf_nb.runtime.inference import PolicyServer
        env = make_env("CartPole-v1", 4, seed=0)
        obs = env.reset(seed=0)
        server = PolicyServer({"name": "mlp", "kwargs": {"hidden_sizes": [64, 64]}},
                              env.observation_space, env.action_space, 0)
        rng = np.random.default_rng(0)
        weights = {"actor_body.0.weight": rng.normal(size=(64, 4)), "actor_body.0.bias": np.zeros(64),
                   "actor_body.2.weight": rng.normal(size=(64, 64)), "actor_body.2.bias": np.zeros(64),
                   "critic_body.0.weight": rng.normal(size=(64, 4)), "critic_body.0.bias": np.zeros(64),
                   "critic_body.2.weight": rng.normal(size=(64, 64)), "critic_body.2.bias": np.zeros(64),
                   "critic_head.weight": rng.normal(size=(1, 64)), "critic_head.bias": np.zeros(1),
                   "actor_head.logits.weight": rng.normal(size=(2, 64)), "actor_head.logits.bias": np.zeros(2)}
        server.set_weights(weights, 1)
        for _ in range(5):
            reply = server.answer([{"obs": obs, "sender": 0, "final_obs": None, "final_mask": None,
                                    "value_only": False}])[0]
            obs = env.step(reply["actions"]).obs
        print("torch" in sys.modules, reply["actions"].shape)
        """
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-3000:]
    assert out.stdout.split() == ["False", "(4,)"], out.stdout


@pytest.mark.parametrize("head", list(SPACES))
def test_acting_without_value_draws_the_same_actions_and_runs_no_critic(head):
    """Off-policy collection asks for no state values: the same actions and log-probs, no critic pass."""
    policy, with_value = _pair(head, seed=2)
    _, without = _pair(head, seed=2)
    obs = np.random.default_rng(5).normal(size=(8, 5)).astype(np.float32)
    without._critic = []  # a critic pass would now fail
    for deterministic in (False, True):
        action, logprob, _ = with_value.act(obs, deterministic)
        a2, lp2 = without.act_without_value(obs, deterministic)
        np.testing.assert_array_equal(a2, action)
        np.testing.assert_array_equal(lp2, logprob)
    torch.manual_seed(7)
    t_action, t_logprob, _ = policy.act(torch.as_tensor(obs))
    torch.manual_seed(7)
    t_a2, t_lp2 = policy.act_without_value(torch.as_tensor(obs))
    torch.testing.assert_close(t_a2, t_action)
    torch.testing.assert_close(t_lp2, t_logprob)


@pytest.mark.parametrize("backend", ["numpy", "torch"])
def test_a_server_asked_for_no_values_answers_without_them(backend):
    env = gym.make("Pendulum-v1")
    cfg = {"name": "mlp", "kwargs": {"hidden_sizes": [8]}, "inference": backend}
    server = PolicyServer(cfg, env.observation_space, env.action_space, 3)
    twin = PolicyServer(cfg, env.observation_space, env.action_space, 3)
    torch_policy = make_policy("mlp", env.observation_space, env.action_space, **policy_kwargs(cfg))
    weights = {k: v.numpy() for k, v in torch_policy.state_dict().items()}
    server.set_weights(weights, 0)
    twin.set_weights(weights, 0)
    obs = np.random.default_rng(0).normal(size=(4, 3)).astype(np.float32)
    msg = {"obs": obs, "sender": 0, "final_obs": None, "final_mask": None, "value_only": False}
    for acting in ("sample", "random"):
        torch.manual_seed(1)
        full = twin.answer([{**msg, "acting": acting}])[0]
        torch.manual_seed(1)
        lean = server.answer([{**msg, "acting": acting, "with_values": False}])[0]
        assert "values" in full and "values" not in lean
        np.testing.assert_array_equal(lean["actions"], full["actions"])
        np.testing.assert_array_equal(lean["logprobs"], full["logprobs"])
    # a values-only round still gets its values
    assert server.answer([{**msg, "value_only": True, "with_values": False}])[0]["values"].shape == (4,)


def test_a_torch_policy_with_only_act_still_acts_without_values():
    """A policy of one's own need not offer ``act_without_value``: its ``act`` serves, the value dropped."""
    env = gym.make("Pendulum-v1")
    acting = TorchActing({"name": "mlp", "kwargs": {"hidden_sizes": [8]}}, env.observation_space,
                         env.action_space, 0)  # fmt: skip

    class OnlyAct:
        def __init__(self, policy):
            self.act = policy.act

    acting.policy = OnlyAct(acting.policy)
    obs = np.zeros((3, 3), np.float32)
    actions, logprobs = acting.act_without_value(obs, deterministic=True)
    expected = acting.act(obs, deterministic=True)
    np.testing.assert_array_equal(actions, expected[0])
    np.testing.assert_array_equal(logprobs, expected[1])
