"""``rlinf-nb robot check SPEC``: a short safe motion and a camera read, a report, exit 0 when healthy."""

from __future__ import annotations

import argparse
import json
import sys


def _robot_check(args: argparse.Namespace) -> int:
    import yaml
    from rlinf_nb.robots.check import check_robot

    overrides = {}
    for item in args.set or []:
        key, sep, value = item.partition("=")
        if not sep or not key:
            print(f"rlinf-nb: error: --set expects KEY=VALUE, got {item!r}", file=sys.stderr)
            return 2
        overrides[key] = yaml.safe_load(value)
    try:
        report = check_robot(args.spec, overrides, steps=args.steps)
    except ValueError as exc:
        print(f"rlinf-nb: error: {exc}", file=sys.stderr)
        return 2
    if args.json:
        items = [vars(i) for i in report.items]
        print(json.dumps({"robot": report.robot, "ok": report.ok, "items": items}, indent=2))
    else:
        print(report.format())
    return 0 if report.ok else 1


def add_robot_parser(sub: argparse._SubParsersAction) -> None:
    """Add ``robot check`` to the ``rlinf-nb`` parser."""
    robot = sub.add_parser("robot", help="robots from specs").add_subparsers(dest="action", required=True)
    p = robot.add_parser(
        "check", help="connect, move each arm a little (safely), read every sensor; exit 0 when healthy"
    )
    p.add_argument("spec", help="packaged spec name (mock_arm, so101, ...) or a spec YAML path")
    p.add_argument(
        "--set",
        action="append",
        metavar="KEY=VALUE",
        help="override a spec field by dotted key, e.g. devices.follower.config.port=/dev/ttyACM1",
    )
    p.add_argument("--steps", type=int, default=10, help="steps of the test motion (default 10)")
    p.add_argument("--json", action="store_true", help="print the report as JSON")
    p.set_defaults(fn=_robot_check)
