"""Run every benchmark in bench/ in one go (``make bench``); each prints its own table."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
BENCHES = [
    "bench_channel.py",
    "bench_codec.py",
    "bench_ppo_cartpole.py",
    "bench_ppo_pushcube.py",  # ~6 min per side at full length
    "bench_sac_pendulum.py",
    "bench_rlpd_vs_sac.py",  # learning, not speed: ~30 min (3 seeds x 3 runs)
    "bench_dashboard.py",
    "bench_dashboard_calls.py",
    "bench_maniskill.py",
    "bench_latency.py",
    "bench_rtc.py",
]


def main() -> int:
    failed = []
    for name in BENCHES:
        print(f"\n=== {name} ===", flush=True)
        if subprocess.run([sys.executable, str(HERE / name)]).returncode != 0:
            failed.append(name)
    if failed:
        print(f"\nfailed: {', '.join(failed)}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
