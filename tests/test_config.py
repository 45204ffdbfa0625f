"""Config errors name the key path, the bad value and what is allowed."""

from __future__ import annotations

import pytest

from rlinf_nb import recipes
from rlinf_nb.client import resolve_config
from rlinf_nb.config import ConfigError
from rlinf_nb.run_config import live_params


def test_recipes_are_listed_and_valid():
    assert "ppo_cartpole" in recipes.names()
    for name in recipes.names():
        resolve_config(name)


def test_unknown_key_names_path_and_suggests():
    with pytest.raises(ConfigError) as exc:
        resolve_config("ppo_cartpole", algo__lrr=0.1)
    msg = str(exc.value)
    assert exc.value.key_path == "algo.lrr"
    assert "did you mean lr" in msg and "allowed keys" in msg


def test_out_of_range_value_names_the_range():
    with pytest.raises(ConfigError) as exc:
        resolve_config("ppo_cartpole", algo__gamma=1.5)
    assert exc.value.key_path == "algo.gamma" and exc.value.value == 1.5
    assert "[0.0, 1.0]" in str(exc.value)


def test_a_channel_timeout_under_a_second_is_refused_naming_the_key():
    with pytest.raises(ConfigError) as exc:
        resolve_config("ppo_cartpole", placement__channel_timeout_s=0)
    assert exc.value.key_path == "placement.channel_timeout_s" and exc.value.value == 0
    assert "[1.0, 86400.0]" in str(exc.value)
    assert resolve_config("ppo_cartpole").placement.channel_timeout_s == 60.0


def test_bad_choice_lists_the_choices():
    with pytest.raises(ConfigError, match="'constant', 'linear'") as exc:
        resolve_config("ppo_cartpole", algo__lr_schedule="cosine")
    assert exc.value.key_path == "algo.lr_schedule"


def test_wrong_type_and_unknown_algorithm_and_recipe():
    with pytest.raises(ConfigError, match="expected an integer") as exc:
        resolve_config("ppo_cartpole", num_envs="many")
    assert exc.value.key_path == "env.num_envs"
    with pytest.raises(ConfigError, match="allowed values: .*ppo") as exc:
        resolve_config("ppo_cartpole", algorithm="nope")
    assert exc.value.key_path == "algorithm"
    with pytest.raises(ConfigError, match="ppo_cartpole"):
        resolve_config("no_such_recipe")


def test_overrides_never_mutate_the_recipe_and_aliases_work():
    cfg = resolve_config("ppo_cartpole", num_envs=4, env_workers=2, **{"algo.lr": 3e-4})
    assert cfg.env.num_envs == 4 and cfg.placement.env.num_workers == 2 and cfg.algo.lr == 3e-4
    assert recipes.load("ppo_cartpole")["env"]["num_envs"] == 8


def test_live_params_are_declared_with_ranges():
    live = live_params(resolve_config("ppo_cartpole"))
    assert {"algo.lr", "algo.ent_coef", "algo.clip_eps"} <= set(live)
    assert "algo.rollout_steps" not in live
    assert live["algo.lr"].metadata["range"] == (1e-7, 1.0)


def test_partial_section_override_keeps_that_sections_defaults():
    cfg = resolve_config("ppo_cartpole", placement__learner="worker", placement__actor__node_group="train")
    assert cfg.placement.actor.node_group == "train"
    assert cfg.placement.actor.num_cpus == 0.5 and cfg.placement.env.num_cpus == 0.25


@pytest.mark.parametrize(
    ("override", "value", "path"),
    [("num_workers", 2, "actor.num_workers"), ("num_gpus", 1.0, "actor.num_gpus"),
     ("node_group", "train", "actor.node_group"), ("resources", {"big": 1.0}, "actor.resources")],
)  # fmt: skip
def test_a_learner_in_the_controller_refuses_an_actor_placement(override, value, path):
    with pytest.raises(
        ConfigError, match=rf"placement\.{path}: got .*placement\.learner: controller.*learner: worker"
    ):
        resolve_config("ppo_cartpole", **{f"placement__actor__{override}": value})


def test_default_run_name_is_a_valid_name_for_every_env_id_form():
    from rlinf_nb.client import _default_name

    for env_id, stem in [("CartPole-v1", "ppo_cartpole_"), ("maniskill:PushCube-v1", "ppo_pushcube_"),
                         ("robot:mock_arm/reach", "ppo_mock_arm_reach_"),
                         ("robot:specs/arm.yaml/reach", "ppo_specs_arm.yaml_reach_")]:  # fmt: skip
        name = _default_name(resolve_config("ppo_cartpole", env__id=env_id))
        assert name.startswith(stem) and "/" not in name and not name.startswith("."), (env_id, name)
