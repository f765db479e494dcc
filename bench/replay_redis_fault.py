"""Replay with a Redis L3 that is killed midway: the run must finish with every byte right.

    python bench/replay_redis_fault.py [--kill-at 0.5] [--restart] -- <hicache replay args>

Starts a private redis-server (persistence off) on a free loopback port, runs
``hicache replay ... --storage redis://127.0.0.1:PORT/0 --json``, kills the server (by PID)
when the replay's progress passes ``--kill-at`` of its requests (``--restart`` starts it
again a little later), and prints the replay's JSON plus what was done to the server.
Exit status: the replay's.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_redis(port: int, workdir: str) -> subprocess.Popen:
    exe = shutil.which("redis-server")
    if exe is None:
        sys.exit("redis-server not found: apt-get install -y redis-server")
    proc = subprocess.Popen([exe, "--port", str(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no",
                             "--dir", workdir, "--maxmemory", "4gb", "--maxmemory-policy", "allkeys-lru"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    for _ in range(100):
        try:
            socket.create_connection(("127.0.0.1", port), timeout=0.1).close()
            return proc
        except OSError:
            time.sleep(0.05)
    proc.kill()
    sys.exit("redis-server did not start")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--kill-at", type=float, default=0.5, help="fraction of requests done when Redis is killed")
    ap.add_argument("--restart", action="store_true", help="start Redis again 5 s after the kill")
    ap.add_argument("replay_args", nargs=argparse.REMAINDER, help="-- then hicache replay arguments")
    args = ap.parse_args()
    rest = [a for a in args.replay_args if a != "--"]
    workdir = tempfile.mkdtemp(prefix="hicache-redis-")
    port = free_port()
    server = start_redis(port, workdir)
    cmd = [sys.executable, "-m", "hicache.cli.main", "replay", *rest, "--storage", f"redis://127.0.0.1:{port}/0", "--json"]
    replay = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    events = []
    killed_at = None
    for line in replay.stderr:  # progress lines: "replay: done/total (...)"
        sys.stderr.write(line)
        if killed_at is None and line.startswith("replay:") and "/" in line:
            done, total = line.split()[1].split("/")
            if int(done) >= args.kill_at * int(total):
                os.kill(server.pid, signal.SIGKILL)
                server.wait()
                killed_at = time.time()
                events.append(f"killed redis-server (pid {server.pid}) at {done}/{total} requests")
                if args.restart:
                    time.sleep(5)
                    server = start_redis(port, workdir)
                    events.append(f"restarted redis-server (pid {server.pid})")
    out = replay.stdout.read()
    rc = replay.wait()
    if server.poll() is None:
        server.kill()
        server.wait()
    shutil.rmtree(workdir, ignore_errors=True)
    result = json.loads(out) if out.strip() else {}
    result["redis_events"] = events
    print(json.dumps(result, indent=2))
    return rc


if __name__ == "__main__":
    sys.exit(main())
