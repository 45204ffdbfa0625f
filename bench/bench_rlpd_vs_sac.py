"""RLPD with scripted demos vs SAC without them: same env, budget, seeds and shared SAC fields, several seeds.

Run: ``.venv/bin/python bench/bench_rlpd_vs_sac.py [--seeds 0 1 2] [--budget 5000] [--demos 10]
[--arms sac] [--set algo__init_alpha=0.1 ...]``
(attaches to, or starts, the local cluster; ~3.5 min per run on 2 cores, three runs per seed, or
``rlpd`` and the SAC arms named by ``--arms``).

Issue 5 asks that ``rlpd_pushcube`` with 10 scripted demo episodes beat SAC without demos on the
same budget and seeds. The slow test checks one seed; this prints the comparison over several,
with three arms per seed:

- ``rlpd``: the ``rlpd_pushcube`` recipe with ``algo.demos: scripted:<demos>`` (no random warm-up:
  the demos replace it, ``random_steps: 0``);
- ``sac``: the same run as plain SAC (:func:`sac_twin_of`: every SAC field the recipe sets, the
  warm-up setting included, no demos, SAC's own critic count);
- ``sac+warmup``: that SAC with SAC's default uniform-random warm-up (``random_steps``), the
  baseline a SAC user would run.

Per run it reports the mean ``success_rate`` over the last quarter of the budget (what the slow test
compares), the mean over the whole run (the area under the success curve, normalised) and the env
steps until ``success_rate`` first reaches 0.5. Then the per-arm means and RLPD's margin over each
SAC arm, per seed and on average. Learning results, not timings: the runs are deterministic given
the seed on a quiet box; wall times are printed only as a guide.
"""

from __future__ import annotations

import argparse
import statistics
import time
import uuid
from typing import Any

import pandas as pd
import yaml

REACHED = 0.5  # success_rate for "env steps to reach"
ARMS = ("rlpd", "sac", "sac+warmup")  # see the module docstring


def sac_twin_of(rlpd_cfg: Any, warmup: bool = False) -> dict:
    """An ``rlpd`` run config as plain SAC: same env, policy, seed, budget and shared SAC fields; no demos.

    ``num_critics`` is left to SAC's default (RLPD's ensemble is part of what is compared). With
    ``warmup`` SAC keeps its own default ``random_steps`` instead of the RLPD recipe's.
    """
    from rlinf_nb.algorithms.sac import SACConfig
    from rlinf_nb.config import to_dict

    d = to_dict(rlpd_cfg)
    shared = {f for f in SACConfig.__dataclass_fields__ if f in d["algo"] and f != "num_critics"}
    if warmup:
        shared.discard("random_steps")
    d["algo"] = {k: v for k, v in d["algo"].items() if k in shared}
    d["algorithm"] = "sac"
    return d


def summarise(df: pd.DataFrame, budget: int) -> dict[str, float]:
    """``late`` (mean success over the last quarter of ``budget``), ``auc`` (mean over all rows) and
    ``to_reach`` (env steps at the first row with success >= REACHED; ``nan`` if never), from a run's
    metrics (rows before any episode ended count as 0 success)."""
    success = df["success_rate"].fillna(0.0)
    late = success[df["env_steps"] > 0.75 * budget]
    hit = df["env_steps"][success >= REACHED]
    return {
        "late": float(late.mean()) if len(late) else float("nan"),
        "auc": float(success.mean()) if len(success) else float("nan"),
        "to_reach": float(hit.iloc[0]) if len(hit) else float("nan"),
    }


def arms(seed: int, budget: int, demos: int, overrides: dict[str, Any] | None = None) -> dict[str, dict]:
    """The three run configs compared for one seed; ``overrides`` (``algo__init_alpha=0.1`` style) go to
    the RLPD run, and through :func:`sac_twin_of` to the SAC arms where they are SAC fields."""
    from rlinf_nb.client import resolve_config
    from rlinf_nb.config import to_dict

    rlpd = resolve_config("rlpd_pushcube", seed=seed, algo__demos=f"scripted:{demos}",
                          budget__total_env_steps=budget, budget__stop_metric=None,
                          budget__stop_value=None, **(overrides or {}))  # fmt: skip
    configs = (to_dict(rlpd), sac_twin_of(rlpd), sac_twin_of(rlpd, warmup=True))
    return dict(zip(ARMS, configs, strict=True))


def run_one(cfg: dict, name: str, budget: int) -> dict[str, float]:
    import rlinf_nb as rl

    t0 = time.time()
    run = rl.launch(cfg, name=f"bench_rlpd_vs_sac_{name}_{uuid.uuid4().hex[:6]}", linger_s=30)
    st = run.wait(timeout=3600, progress=False)
    if st["state"] != "finished":
        raise RuntimeError(f"{name}: the run ended {st['state']}: {st.get('error')}")
    return {**summarise(run.metrics(), budget), "seconds": time.time() - t0}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--budget", type=int, default=5000, help="env steps per run")
    parser.add_argument("--demos", type=int, default=10, help="scripted demo episodes for RLPD")
    parser.add_argument("--arms", nargs="+", default=list(ARMS), choices=ARMS,
                        help="which arms to run per seed (rlpd is always run: the margins are its)")  # fmt: skip
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                        help="a recipe override for every arm, e.g. algo__init_alpha=0.1 (YAML value)")  # fmt: skip
    args = parser.parse_args()
    overrides = {k: yaml.safe_load(v) for k, _, v in (item.partition("=") for item in args.set)}
    import rlinf_nb as rl

    rl.attach(quiet=True)
    rows = []
    for seed in args.seeds:
        for arm, cfg in arms(seed, args.budget, args.demos, overrides).items():
            if arm != "rlpd" and arm not in args.arms:
                continue
            result = run_one(cfg, f"{arm.replace('+', '_')}_s{seed}", args.budget)
            rows.append({"seed": seed, "arm": arm, **result})
            print(f"seed {seed} {arm:<11} last quarter {result['late']:.3f}  auc {result['auc']:.3f}  "
                  f"to {REACHED} at {result['to_reach']:.0f} env steps  ({result['seconds']:.0f} s)",
                  flush=True)  # fmt: skip
    table = pd.DataFrame(rows)
    print(f"\nPushCube-v1, {args.budget} env steps, RLPD with {args.demos} scripted demos, overrides "
          f"{overrides or 'none'}; mean over seeds {args.seeds}:")  # fmt: skip
    print(table.groupby("arm")[["late", "auc", "to_reach"]].mean().round(3).to_string())
    late = table.pivot(index="seed", columns="arm", values="late")
    for baseline in (arm for arm in ARMS[1:] if arm in late):
        margins = late["rlpd"] - late[baseline]
        print(f"rlpd - {baseline} (last quarter): per seed {', '.join(f'{m:+.3f}' for m in margins)}; "
              f"mean {statistics.mean(margins):+.3f}; rlpd ahead in {(margins > 0).sum()}/{len(margins)}")  # fmt: skip


if __name__ == "__main__":
    main()
