"""``rlinf-nb data merge|filter|info``: the dataset tools on the command line.

``add_data_parser(sub)`` registers the group on the main parser's subparsers; heavy imports
(LeRobot, torch) happen only when a command runs.
"""

from __future__ import annotations

import argparse
import json
import sys

__all__ = ["add_data_parser"]


def add_data_parser(sub: argparse._SubParsersAction) -> None:
    data = sub.add_parser(
        "data", help="LeRobot datasets: merge shards, filter episodes, info"
    ).add_subparsers(dest="action", required=True)
    p = data.add_parser("merge", help="join a recording's finalized shards (or datasets) into one dataset")
    p.add_argument("sources", nargs="+", metavar="ROOT", help="recording roots or LeRobot dataset dirs")
    p.add_argument("out", metavar="OUT", help="new dataset directory (must not exist)")
    p.set_defaults(fn=_merge)

    p = data.add_parser("filter", help="keep episodes by success, intervention, length, task, expression")
    p.add_argument("src", metavar="SRC", help="a LeRobot dataset dir (merge a recording root first)")
    p.add_argument("out", metavar="OUT", help="new dataset directory (must not exist)")
    g = p.add_mutually_exclusive_group()
    g.add_argument(
        "--success", dest="success", action="store_const", const=True, help="successful episodes only"
    )
    g.add_argument("--failed", dest="success", action="store_const", const=False, help="failed episodes only")
    g = p.add_mutually_exclusive_group()
    g.add_argument("--intervened", dest="intervention", action="store_const", const=True,
                   help="episodes with a human intervention")  # fmt: skip
    g.add_argument("--no-intervention", dest="intervention", action="store_const", const=False,
                   help="episodes without any intervention")  # fmt: skip
    p.add_argument("--min-length", type=int, help="at least this many frames")
    p.add_argument("--max-length", type=int, help="at most this many frames")
    p.add_argument("--task", action="append", help="keep this task (repeat for several)")
    p.add_argument(
        "--where",
        help="Python expression over index, length, task, tasks, success, intervention, "
        'intervention_frames, total_reward, done; e.g. "success and length < 200"',
    )
    p.set_defaults(fn=_filter)

    p = data.add_parser("info", help="episodes, frames, tasks, features, shard states")
    p.add_argument("path", metavar="ROOT", help="a recording root or a LeRobot dataset dir")
    p.add_argument("--json", action="store_true", help="print JSON")
    p.set_defaults(fn=_info)


def _fail(exc: Exception) -> int:
    print(f"rlinf-nb data: error: {exc}", file=sys.stderr)
    return 2


def _merge(args: argparse.Namespace) -> int:
    from rlinf_nb.data.describe import info
    from rlinf_nb.data.merging import merge

    try:
        out = merge(args.sources, args.out)
    except (ValueError, FileExistsError, FileNotFoundError) as exc:
        return _fail(exc)
    d = info(out)
    print(f"[rlinf-nb] merged {d.episodes} episodes ({d.frames} frames, {len(d.tasks)} tasks) into {out}")
    return 0


def _filter(args: argparse.Namespace) -> int:
    from rlinf_nb.data.filtering import filter_dataset

    try:
        keep = filter_dataset(
            args.src, args.out, success=args.success, intervention=args.intervention,
            min_length=args.min_length, max_length=args.max_length, task=args.task, where=args.where,
        )  # fmt: skip
    except (ValueError, FileExistsError, FileNotFoundError) as exc:
        return _fail(exc)
    print(f"[rlinf-nb] kept {len(keep)} episodes of {args.src} in {args.out}")
    return 0


def _info(args: argparse.Namespace) -> int:
    from rlinf_nb.data.describe import info

    try:
        d = info(args.path)
    except (ValueError, FileNotFoundError) as exc:
        return _fail(exc)
    print(json.dumps(d.to_dict(), indent=2) if args.json else d)
    return 0
