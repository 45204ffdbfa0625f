"""The pure pieces of bench/bench_ppo_pushcube.py, its single-process reference loop and
bench/bench_rlpd_vs_sac.py (no envs, no cluster)."""

from __future__ import annotations

import dataclasses
import math
import sys
from pathlib import Path

import pandas as pd
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "bench"))

import bench_ppo_pushcube  # noqa: E402
import bench_rlpd_vs_sac  # noqa: E402
import ppo_pushcube_reference as reference  # noqa: E402

from rlinf_nb.client import resolve_config  # noqa: E402


def _metrics(rates: list[float | None], t0: float = 1000.0) -> pd.DataFrame:
    """Rows as a run writes them: 512 env steps per iteration, 10 s per iteration after 30 s of setup."""
    n = len(rates)
    return pd.DataFrame({
        "env_steps": [512 * (i + 1) for i in range(n)],
        "wall_time": [t0 + 30.0 + 10.0 * (i + 1) for i in range(n)],
        "steps_per_s": [51.2] * n,
        "success_rate": rates,
    })  # fmt: skip


def test_first_reaching_takes_the_first_row_at_or_over_the_threshold():
    df = _metrics([None, 0.1, 0.79, 0.8, 0.95])
    out = bench_ppo_pushcube.first_reaching(df, "success_rate", 0.8, t0=1000.0)
    assert out["reached"] is True
    assert out["steps"] == 4 * 512  # 0.8 counts (>=); 0.79 does not
    assert out["seconds"] == pytest.approx(70.0)
    assert out["setup_seconds"] == pytest.approx(30.0)  # first row's wall time less its own 10 s
    assert out["steps_per_s"] == pytest.approx(4 * 512 / 40.0)
    assert out["success_rate"] == pytest.approx(0.8)


def test_first_reaching_reports_the_budget_when_never_reached():
    df = _metrics([None, 0.2, 0.5])
    out = bench_ppo_pushcube.first_reaching(df, "success_rate", 0.8, t0=1000.0)
    assert out["reached"] is False
    assert out["steps"] == 3 * 512 and out["seconds"] == pytest.approx(60.0)
    assert out["success_rate"] == pytest.approx(0.5)
    with pytest.raises(ValueError, match="no metrics rows"):
        bench_ppo_pushcube.first_reaching(df.iloc[:0], "success_rate", 0.8, t0=1000.0)


def test_reference_defaults_are_the_recipe():
    """The reference loop's defaults equal the resolved ppo_pushcube recipe: "matched" stays true."""
    from_recipe = reference.PushCubeSettings.from_run_config(resolve_config("ppo_pushcube"))
    assert from_recipe == reference.PushCubeSettings()
    assert from_recipe.num_envs == 16
    assert from_recipe.target == 0.8 and from_recipe.window == 20
    # every PPOConfig field is either implemented by the loop or at its default
    cfg = resolve_config("ppo_pushcube")
    fields = {f.name for f in dataclasses.fields(cfg.algo)}
    assert fields == set(reference.PPO_FIELDS) | set(reference.PPO_FIELDS_AT_DEFAULT)


def test_reference_refuses_configs_it_does_not_implement():
    with pytest.raises(ValueError, match="policy.chunk"):
        reference.PushCubeSettings.from_run_config(resolve_config("ppo_pushcube", policy__chunk=2))
    with pytest.raises(ValueError, match="algo.critic_warmup_updates"):
        reference.PushCubeSettings.from_run_config(
            resolve_config("ppo_pushcube", algo__critic_warmup_updates=3)
        )
    with pytest.raises(ValueError, match="algorithm"):
        reference.PushCubeSettings.from_run_config(resolve_config("sac_pendulum"))


def test_worker_order_regroups_episodes_like_the_controller():
    # envs 0-7 are worker 0, 8-15 worker 1; episodes in finishing order
    env_indices = [9, 2, 15, 0, 8]
    values = [1.0, 2.0, 3.0, 4.0, 5.0]
    assert reference.worker_order(env_indices, values, envs_per_worker=8) == [2.0, 4.0, 1.0, 3.0, 5.0]


def test_sac_twin_keeps_the_shared_sac_fields_and_drops_the_demos():
    rlpd = resolve_config("rlpd_pushcube", seed=3, algo__demos="scripted:10", algo__utd=3.0)
    twin = resolve_config(bench_rlpd_vs_sac.sac_twin_of(rlpd))  # a valid sac run config
    assert twin.algorithm == "sac" and twin.seed == 3 and twin.env == rlpd.env and twin.policy == rlpd.policy
    assert twin.budget == rlpd.budget
    assert (twin.algo.utd, twin.algo.random_steps, twin.algo.gamma) == (3.0, 0, rlpd.algo.gamma)
    assert not hasattr(twin.algo, "demos")
    assert twin.algo.num_critics == 2  # SAC's own default, not RLPD's ensemble
    with_warmup = resolve_config(bench_rlpd_vs_sac.sac_twin_of(rlpd, warmup=True))
    from rlinf_nb.algorithms.sac import SACConfig

    assert with_warmup.algo.random_steps == SACConfig().random_steps > 0


def test_rlpd_vs_sac_summary_reads_late_success_area_and_first_reach():
    df = pd.DataFrame({"env_steps": [1000, 2000, 3000, 4000, 5000],
                       "success_rate": [None, 0.2, 0.6, 0.4, 0.8]})  # fmt: skip
    out = bench_rlpd_vs_sac.summarise(df, budget=5000)
    assert out["late"] == pytest.approx((0.4 + 0.8) / 2)  # the rows past 3/4 of the budget (3750 env steps)
    assert out["auc"] == pytest.approx((0 + 0.2 + 0.6 + 0.4 + 0.8) / 5)  # no episode yet counts as 0
    assert out["to_reach"] == 3000
    never = bench_rlpd_vs_sac.summarise(df.assign(success_rate=0.1), budget=5000)
    assert math.isnan(never["to_reach"])
