"""The ``rlinf-nb`` command: cluster up/down/status and the lab."""

from __future__ import annotations

import argparse
import json
import sys


def _cluster_up(args: argparse.Namespace) -> int:
    from rlinf_nb.runtime import cluster

    state, started = cluster.up(args.config)
    if started:
        print(
            f"[rlinf-nb] cluster up at {state.address} ({len(state.nodes)} node(s)); token {state.token_path}"
        )
    else:
        print(f"[rlinf-nb] cluster already up at {state.address}; nothing to do")
    return 0


def _cluster_down(args: argparse.Namespace) -> int:
    from rlinf_nb.runtime import cluster

    cluster.down()
    return 0


def _cluster_status(args: argparse.Namespace) -> int:
    from rlinf_nb.connection import attach, cluster_info
    from rlinf_nb.runtime import cluster

    state = cluster.read_state()
    if state is None or not cluster.is_up(state):
        print("[rlinf-nb] cluster: down" + (" (stale state recorded)" if state else ""))
        return 1
    attach(start=False, quiet=True)
    info = cluster_info()
    if args.json:
        print(json.dumps(info, indent=2, default=str))
        return 0
    print(f"cluster {state.address}  loopback-only={state.loopback_only}  up since {_ago(state.started_at)}")
    print(f"{'node':<14}{'address':<16}{'alive':<7}resources")
    names = {n.ip: n.name for n in state.nodes}
    for node in info["nodes"]:
        res = {k: v for k, v in node["resources"].items() if not k.startswith("node:")}
        res_text = ", ".join(f"{k}={v:g}" for k, v in sorted(res.items()) if "memory" not in k)
        print(f"{names.get(node['address'], '?'):<14}{node['address']:<16}{str(node['alive']):<7}{res_text}")
    print(f"runs: {', '.join(info['runs']) or '(none)'}")
    if info["robots"]:
        by_id = {n["node_id"]: n["address"] for n in info["nodes"]}
        print("robots:")
        for r in info["robots"]:
            held = r["held_by"]
            who = f"held by run {held['run']!r}, env worker {held['rank']}" if held else "free"
            print(f"  {r['robot']:<12}{names.get(by_id.get(r['node_id']), '?'):<14}{who}")
    print(f"actors: {', '.join(info['actors']) or '(none)'}")
    return 0


def _ago(t: float) -> str:
    import time

    secs = int(time.time() - t)
    return f"{secs // 3600}h{secs % 3600 // 60:02d}m" if secs >= 3600 else f"{secs // 60}m{secs % 60:02d}s"


def _lab(args: argparse.Namespace) -> int:
    from rlinf_nb.lab import serve_lab

    return serve_lab(port=args.port, open_path=args.open, no_browser=True)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="rlinf-nb", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    cl = sub.add_parser("cluster", help="the local persistent Ray cluster").add_subparsers(
        dest="action", required=True
    )
    p = cl.add_parser("up", help="start our cluster (exit 0 if already up)")
    p.add_argument("--config", help="cluster YAML with node groups (default: one local node)")
    p.set_defaults(fn=_cluster_up)
    cl.add_parser("down", help="stop our cluster's processes (only ours)").set_defaults(fn=_cluster_down)
    p = cl.add_parser("status", help="nodes, resources, runs")
    p.add_argument("--json", action="store_true")
    p.set_defaults(fn=_cluster_status)
    p = sub.add_parser("lab", help="start the cluster and JupyterLab on 127.0.0.1 with a token")
    p.add_argument("--port", type=int, default=8888)
    p.add_argument("--open", default="notebooks/00_quickstart.ipynb")
    p.set_defaults(fn=_lab)
    # `rlinf-nb data merge|filter|info` (rlinf_nb/data/cli.py; imports LeRobot only when run)
    from rlinf_nb.data.cli import add_data_parser

    add_data_parser(sub)
    # `rlinf-nb robot check SPEC` (robots/cli.py; imports a driver's SDK only when run)
    from rlinf_nb.robots.cli import add_robot_parser

    add_robot_parser(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    from rlinf_nb.config import ConfigError
    from rlinf_nb.runtime.cluster import ClusterError

    args = build_parser().parse_args(argv)
    try:
        return args.fn(args)
    except (ConfigError, ClusterError, FileNotFoundError) as exc:
        print(f"rlinf-nb: error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
