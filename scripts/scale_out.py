#!/usr/bin/env python3
"""Scale-out shown on one machine: worker hosts in network namespaces, one Redis, one API.

Each "host" is a network namespace of its own (`rlsb-h<k>`) running `rl-sandbox worker`, joined
by a veth pair to a core namespace (`rlsb-core`) that holds Redis, the API and the load
generator (`rl-sandbox bench --url` on the core's loopback). Hosts reach Redis only over their
veth: 10.231.<k>.2 -> 10.231.<k>.1. Every address lives inside a namespace this script creates;
the machine's own network is not touched, and traffic never leaves these namespaces.
Hosts are added one at a time; after each, the same bounded sweep measures throughput.

Honest limits: all hosts share this machine's cores. With one worker per host, throughput grows
with hosts while idle cores remain and flattens once they are used up; hosts here show that the
queue, the API and the workers scale across network boundaries, not that cores multiply.

Processes are started with `nsenter --net` (not `ip netns exec`, which remounts /sys and hides
the cgroup hierarchy the jail needs). Namespaces and processes are removed at the end, on error
and on Ctrl-C/SIGTERM; namespaces left by a killed run are removed at the next start
(`--cleanup` does only that). Needs root, iproute2, nsenter.

    .venv/bin/python scripts/scale_out.py [--hosts 1 2 3 4] [--workers-per-host 1]
        [--workloads print,sympy] [--concurrency 32] [--point-s 8] [--out reports/scale_out]
"""

from __future__ import annotations

import argparse
import contextlib
import glob
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from sandbox_service.local import procs

PREFIX = "rlsb-"
CORE = f"{PREFIX}core"
REDIS_PORT = 6390
API_PORT = 8000
SUBNET = "10.231"


def sh(*argv: str) -> None:
    subprocess.run(argv, check=True, capture_output=True, text=True)


def in_ns(ns: str, argv: list[str]) -> list[str]:
    return ["nsenter", f"--net=/run/netns/{ns}", *argv]


def our_namespaces() -> list[str]:
    listed = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True, check=True)
    return [line.split()[0] for line in listed.stdout.splitlines() if line.startswith(PREFIX)]


def cleanup_namespaces() -> None:
    # Deleting a namespace deletes its end of each veth pair, and with it the peer.
    for ns in our_namespaces():
        subprocess.run(["ip", "netns", "del", ns], check=False, capture_output=True)


def cleanup_cgroups() -> None:
    """Remove the hosts' (empty) cgroup parents, under cgroup v1 controllers or v2."""
    for path in glob.glob("/sys/fs/cgroup/*/rl-sandbox-scale-h*") + glob.glob(
        "/sys/fs/cgroup/rl-sandbox-scale-h*"
    ):
        with contextlib.suppress(OSError):
            os.rmdir(path)


class Cluster:
    """The namespaces, Redis, API and hosts' workers of one run."""

    def __init__(self, workers_per_host: int, log_dir: Path) -> None:
        self.workers_per_host = workers_per_host
        self.log_dir = log_dir
        self.processes: list[subprocess.Popen[bytes]] = []
        self.hosts = 0
        base = {k: v for k, v in os.environ.items() if not k.startswith("RL_SANDBOX_")}
        base.pop("REDIS_URL", None)
        self.env = {
            **base,
            "RL_SANDBOX_QUEUE_NAME": "rl-sandbox-scale",
            "RL_SANDBOX_LOG_LEVEL": "WARNING",
            "RL_SANDBOX_MAX_QUEUE_DEPTH": "100000",
        }

    def spawn(self, ns: str, argv: list[str], env: dict[str, str], log: str) -> None:
        with (self.log_dir / log).open("ab") as out:
            proc = subprocess.Popen(
                in_ns(ns, argv), env=env, stdin=subprocess.DEVNULL, stdout=out,
                stderr=subprocess.STDOUT, start_new_session=True, preexec_fn=procs.die_with_parent,
            )  # fmt: skip
        self.processes.append(proc)

    def start_core(self) -> None:
        sh("ip", "netns", "add", CORE)
        sh(*in_ns(CORE, ["ip", "link", "set", "lo", "up"]))
        # Bound to every address of the core namespace: only lo and our veths live there.
        redis = ["redis-server", "--port", str(REDIS_PORT), "--bind", "0.0.0.0",
                 "--protected-mode", "no", "--save", "", "--appendonly", "no",
                 "--maxclients", "10000", "--loglevel", "warning"]  # fmt: skip
        self.spawn(CORE, redis, self.env, "redis.log")
        api_env = {**self.env, "RL_SANDBOX_REDIS_URL": f"redis://127.0.0.1:{REDIS_PORT}/0"}
        api = [sys.executable, "-m", "sandbox_service.cli", "api", "--port", str(API_PORT)]
        self.spawn(CORE, api, api_env, "api.log")

    def add_host(self) -> None:
        k = self.hosts + 1
        host = f"{PREFIX}h{k}"
        core_end, host_end = f"rlsbc{k}", f"rlsbh{k}"
        sh("ip", "netns", "add", host)
        sh("ip", "link", "add", core_end, "netns", CORE, "type", "veth",
           "peer", "name", host_end, "netns", host)  # fmt: skip
        sh(*in_ns(CORE, ["ip", "addr", "add", f"{SUBNET}.{k}.1/24", "dev", core_end]))
        sh(*in_ns(CORE, ["ip", "link", "set", core_end, "up"]))
        sh(*in_ns(host, ["ip", "addr", "add", f"{SUBNET}.{k}.2/24", "dev", host_end]))
        sh(*in_ns(host, ["ip", "link", "set", host_end, "up"]))
        sh(*in_ns(host, ["ip", "link", "set", "lo", "up"]))
        # Each host has jail uids and a cgroup parent of its own, as separate machines would.
        env = {
            **self.env,
            "RL_SANDBOX_REDIS_URL": f"redis://{SUBNET}.{k}.1:{REDIS_PORT}/0",
            "RL_SANDBOX_CGROUP_PARENT": f"rl-sandbox-scale-h{k}",
            "RL_SANDBOX_SANDBOX_UID_BASE": str(64100 + 16 * k),
            "RL_SANDBOX_WORKERS": str(self.workers_per_host),
        }
        worker = [sys.executable, "-m", "sandbox_service.cli", "worker"]
        self.spawn(host, worker, env, f"host{k}.log")
        self.hosts = k

    def probe(self) -> str:
        """/readyz's detail, asked from inside the core namespace."""
        code = (
            "import json, sys, urllib.request\n"
            "try:\n    r = urllib.request.urlopen(sys.argv[1], timeout=2)\n"
            "    print(json.load(r)['detail'])\n"
            "except Exception as e:\n    print(getattr(e, 'code', None) or e)"
        )
        url = f"http://127.0.0.1:{API_PORT}/readyz"
        done = subprocess.run(
            in_ns(CORE, [sys.executable, "-c", code, url]), capture_output=True, text=True
        )
        return done.stdout.strip()

    def wait_workers(self, timeout_s: float = 180.0) -> None:
        want = f"{self.hosts * self.workers_per_host} live workers"
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            dead = [p.args for p in self.processes if p.poll() is not None]
            if dead:
                raise RuntimeError(f"exited: {dead}; logs in {self.log_dir}")
            if self.probe() == want:
                return
            time.sleep(0.5)
        raise RuntimeError(f"not {want} after {timeout_s:.0f} s ({self.probe()})")

    def bench(self, args: argparse.Namespace, out: Path) -> dict[str, Any]:
        argv = [
            sys.executable, "-m", "sandbox_service.cli", "bench",
            "--url", f"http://127.0.0.1:{API_PORT}", "--no-baseline", "--no-progress",
            "--workloads", args.workloads, "--concurrency", *map(str, args.concurrency),
            "--point-s", str(args.point_s), "--out", str(out),
        ]  # fmt: skip
        subprocess.run(in_ns(CORE, argv), check=False, env=self.env, stdout=subprocess.DEVNULL)
        report: dict[str, Any] = json.loads((out / "bench.json").read_text())
        return report

    def stop(self) -> None:
        procs.stop(list(reversed(self.processes)), grace_s=30.0)


def run(args: argparse.Namespace) -> list[dict[str, Any]]:
    out = Path(args.out).resolve()
    out.mkdir(parents=True, exist_ok=True)
    cluster = Cluster(args.workers_per_host, out)
    rows: list[dict[str, Any]] = []
    try:
        cluster.start_core()
        for hosts in range(1, max(args.hosts) + 1):
            cluster.add_host()
            if hosts not in args.hosts:
                continue
            cluster.wait_workers()
            report = cluster.bench(args, out / f"hosts{hosts}")
            for point in report["points"]:
                row = {
                    "hosts": hosts,
                    "workers": hosts * args.workers_per_host,
                    **{k: point[k] for k in ("workload", "concurrency", "calls", "failed")},
                    **{k: point[k] for k in ("calls_per_s", "p50_ms", "p99_ms", "load_avg_1m")},
                }
                rows.append(row)
                print(json.dumps(row), flush=True)
    finally:
        cluster.stop()
        cleanup_namespaces()
        cleanup_cgroups()
    return rows


def summarise(rows: list[dict[str, Any]], out: Path) -> str:
    lines = [
        "| hosts | workload | concurrency | calls/s | x 1 host | p50 ms | p99 ms | failed | load |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    one = {(r["workload"], r["concurrency"]): r["calls_per_s"] for r in rows if r["hosts"] == 1}
    for r in rows:
        ratio = r["calls_per_s"] / one[(r["workload"], r["concurrency"])] if one else float("nan")
        lines.append(
            f"| {r['hosts']} | {r['workload']} | {r['concurrency']} | {r['calls_per_s']} | "
            f"{ratio:.2f} | {r['p50_ms']} | {r['p99_ms']} | {r['failed']} | {r['load_avg_1m']} |"
        )
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return "\n".join(lines)
    fig, ax = plt.subplots(figsize=(5.5, 3.4))
    for key in sorted(one):
        mine = [r for r in rows if (r["workload"], r["concurrency"]) == key]
        ax.plot([r["hosts"] for r in mine], [r["calls_per_s"] for r in mine], "o-",
                label=f"{key[0]}, c={key[1]}")  # fmt: skip
    ax.set_xticks(sorted({r["hosts"] for r in rows}))
    ax.set_xlabel("worker hosts (network namespaces, 1 worker each)")
    ax.set_ylabel("calls/s")
    ax.set_title(f"scale-out on one {os.cpu_count()}-core machine", fontsize=10)
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(out / "scale_out.png", dpi=80)
    plt.close(fig)
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--hosts", type=int, nargs="+", default=[1, 2, 3, 4])
    parser.add_argument("--workers-per-host", type=int, default=1)
    parser.add_argument("--workloads", default="print,sympy")
    parser.add_argument("--concurrency", type=int, nargs="+", default=[32])
    parser.add_argument("--point-s", type=float, default=8.0)
    parser.add_argument("--out", default="reports/scale_out")
    parser.add_argument("--cleanup", action="store_true", help="only remove leftover namespaces")
    args = parser.parse_args()
    if os.geteuid() != 0:
        raise SystemExit("needs root (network namespaces, jails)")
    cleanup_namespaces()
    if args.cleanup:
        cleanup_cgroups()
        return 0

    def interrupted(signum: int, frame: object) -> None:
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, interrupted)
    load_before = os.getloadavg()
    try:
        rows = run(args)
    except KeyboardInterrupt:
        print("interrupted; processes stopped and namespaces removed", file=sys.stderr)
        return 130
    out = Path(args.out)
    report = {
        "cores": os.cpu_count(),
        "load_avg_before": [round(x, 2) for x in load_before],
        "load_avg_after": [round(x, 2) for x in os.getloadavg()],
        "workers_per_host": args.workers_per_host,
        "rows": rows,
    }
    (out / "scale_out.json").write_text(json.dumps(report, indent=1) + "\n")
    table = summarise(rows, out)
    (out / "scale_out.md").write_text(table + "\n")
    print(f"load average before {report['load_avg_before']}, after {report['load_avg_after']}")
    print(table)
    return 1 if any(r["failed"] for r in rows) else 0


if __name__ == "__main__":
    sys.exit(main())
