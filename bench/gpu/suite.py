"""The GPU suite (issue 28): every check the CUDA path needs, in one command, in minutes.

A GPU machine comes by chance, for about 15 minutes in all (its start-up included), with
no network; so everything it should prove is prepared here and runs first, once:

    bash bench/gpu/run.sh [--device cuda|cpu] [--out DIR] [--steps a,b] [--budget-s S]

Steps, in this order (each a subprocess of this tree, time-boxed with ``timeout``, its
output in the log):

``env``           python / torch / triton / CUDA versions, the card and its driver;
``transfer-*``    ``hicache bench transfer --duplex`` on DeepSeek-V4-Flash and Llama-3.1-8B
                  pages: D2H, H2D and both at once against contiguous DMA copies of the same
                  bytes and a per-page ``copy_`` loop, in the same run;
``overlap``       ``hicache bench overlap``: the share of a per-layer load hidden behind a
                  stand-in layer compute; ``overlap-bounded`` the same with the copy kernel
                  on 16 programs (``--gpu-programs``);
``tests``         the ``gpu``-marked tests (``--device cpu``: their CPU halves, marked
                  ``cpu_half``, Triton under ``TRITON_INTERPRET=1``), pass/fail per test;
``replay``        ``hicache replay --device D`` of the main job (DeepSeek-V4-Flash), every
                  byte of every page checked: 0 mismatched;
``replay-tiny``   ``hicache replay --model tiny --device D``: the tiny DeepSeek-V4-style
                  model's logits through all three tiers against a recompute, bit-exact;
``tune-copy``     ``bench/gpu/tune_copy.py``: the Triton kernel at each bytes-per-program x
                  warps against the DMA copy (where ``CHUNK_BYTES`` / ``NUM_WARPS`` come from).

Out: ``gpu_suite.json`` (rewritten after every step, so a run cut short still reports what
finished), ``gpu_suite.md`` (the tables), ``gpu_suite.log`` (every step's output, one after
another) and ``gpu_suite_tests.xml`` (pytest's JUnit report): four files, because the GPU
machine brings back at most eight. Exit status 0 only when every step passed.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from bench.gpu import report

ROOT = Path(__file__).resolve().parents[2]
CLI = (sys.executable, "-m", "hicache.cli.main")
JSON_NAME, MD_NAME, LOG_NAME, JUNIT_NAME = "gpu_suite.json", "gpu_suite.md", "gpu_suite.log", "gpu_suite_tests.xml"
KILL_AFTER_S = 10          # after a step's timeout, SIGKILL if SIGTERM did not end it
MIN_STEP_S = 15            # a step given less than this is skipped (out of time)
# The whole run: under 8 minutes on an H100 leaves a rerun inside the machine's 15; the CPU
# dry run keeps CI's added time small.
BUDGET_S = {"cuda": 470, "cpu": 240}

ENV_PROBE = r"""
import json, os, platform, subprocess, sys
out = {"python": platform.python_version(), "cpus": os.cpu_count(), "platform": platform.platform()}
try:
    import torch
    out.update(torch=torch.__version__, cuda=torch.version.cuda, cuda_available=torch.cuda.is_available())
    if torch.cuda.is_available():
        p = torch.cuda.get_device_properties(0)
        out.update(gpu=p.name, gpu_memory_gib=round(p.total_memory / 2**30, 1),
                   capability=f"{p.major}.{p.minor}", sms=p.multi_processor_count)
except Exception as exc:
    out["torch_error"] = repr(exc)
try:
    import triton
    out["triton"] = triton.__version__
except Exception as exc:
    out["triton_error"] = repr(exc)
try:
    q = subprocess.run(["nvidia-smi", "--query-gpu=driver_version,name,memory.total",
                        "--format=csv,noheader"], capture_output=True, text=True, timeout=20)
    out["nvidia_smi"] = q.stdout.strip() or q.stderr.strip()
except Exception as exc:
    out["nvidia_smi"] = f"unavailable: {exc}"
print(json.dumps(out))
"""


@dataclass(frozen=True)
class Step:
    """One time-boxed command. ``kind`` says how its output is judged (see ``judge``)."""

    name: str
    argv: tuple[str, ...]
    timeout_s: int
    kind: str                  # env | tests | replay | replay_tiny | transfer | overlap


def plan(device: str, junit: Path, test_paths: tuple[str, ...] = ("tests",)) -> list[Step]:
    """The steps and their sizes: full on CUDA, small on the CPU dry run (same commands)."""
    gpu = device == "cuda"
    marker = "gpu" if gpu else "cpu_half"
    v4_pages, llama_pages = (1024, 32) if gpu else (8, 1)     # ~1.2 / 1.0 GiB per direction on CUDA
    reps = "5" if gpu else "1"
    # The figures first: they take about two minutes and are what the machine is for; a
    # test that hangs then costs the tests step its time box, not the measurements.
    return [
        Step("env", (sys.executable, "-c", ENV_PROBE), 60, "env"),
        Step("transfer-v4-flash", CLI + ("bench", "transfer", "--device", device, "--config", "deepseek-v4-flash",
                                         "--pages", str(v4_pages), "--reps", reps, "--duplex", "--json"),
             120, "transfer"),
        Step("transfer-llama-3.1-8b", CLI + ("bench", "transfer", "--device", device, "--config", "llama-3.1-8b",
                                             "--pages", str(llama_pages), "--reps", reps, "--duplex", "--json"),
             120, "transfer"),
        Step("overlap", CLI + ("bench", "overlap", "--device", device, "--config", "deepseek-v4-flash",
                               "--pages", "512" if gpu else "16", "--reps", reps, "--json"), 90, "overlap"),
        # The same with the copy's grid bounded to a few programs (TransferConfig.gpu_programs):
        # does leaving SMs to the matmuls let the load hide, and what does it cost the copy?
        Step("overlap-bounded", CLI + ("bench", "overlap", "--device", device, "--config", "deepseek-v4-flash",
                                       "--pages", "512" if gpu else "16", "--reps", reps, "--gpu-programs", "16",
                                       "--json"), 90, "overlap"),
        # -v: a line per test as it ends, so a run killed at its timeout (no JUnit file then)
        # still says which passed; faulthandler prints the stacks of a test that hangs; a
        # module that cannot be collected fails the step but does not stop the others.
        Step("tests", (sys.executable, "-m", "pytest", *test_paths, "-m", marker, "-v", "-rfEs",
                       "-p", "no:cacheprovider", "-o", "faulthandler_timeout=120",
                       "--continue-on-collection-errors", f"--junitxml={junit}"),
             200 if gpu else 150, "tests"),
        Step("replay", CLI + ("replay", "--device", device, "--conversations", "24" if gpu else "3",
                              "--verify", "full", "--quiet", "--json"), 120, "replay"),
        Step("replay-tiny", CLI + ("replay", "--model", "tiny", "--device", device,
                                   "--conversations", "6" if gpu else "2", "--quiet", "--json"), 120,
             "replay_tiny"),
        # The Triton kernel's launch shape (bytes per program x warps) against the DMA copy.
        Step("tune-copy", (sys.executable, "-m", "bench.gpu.tune_copy", "--device", device,
                           "--host-layouts", "layer_first", "--chunks", "0,64,16" if gpu else "0,1",
                           "--programs", "16,64,264" if gpu else "2"),
             150 if gpu else 90, "tune"),
    ]


class _Parser(argparse.ArgumentParser):
    """Bad flags are one line on stderr and exit status 2 (as the ``hicache`` CLI)."""

    def error(self, message: str):
        self.exit(2, f"{self.prog}: error: {message}\n")


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = _Parser(prog="bench/gpu/run.sh", allow_abbrev=False,
                description="Run the GPU suite; write gpu_suite.json/.md/.log under --out.")
    p.add_argument("--device", choices=["cuda", "cpu"], default="cuda",
                   help="cuda (default): the real run; cpu: the dry run (small sizes, Triton interpreted)")
    p.add_argument("--out", default=os.environ.get("OUT"),
                   help="output directory (default: $OUT, which the GPU machine brings back)")
    p.add_argument("--steps", default=None, help="comma-separated step names to run (default: all)")
    p.add_argument("--tests", nargs="+", default=["tests"], metavar="PATH",
                   help="what the tests step collects (default: tests; CI's dry run names a few files, "
                        "since its own pytest run has already run every CPU half)")
    p.add_argument("--budget-s", type=float, default=None,
                   help=f"the whole run's time box in seconds (default {BUDGET_S['cuda']} on cuda, "
                        f"{BUDGET_S['cpu']} on cpu)")
    return p.parse_args(argv)


class Suite:
    def __init__(self, device: str, out: Path, steps: list[Step], budget_s: float):
        self.device, self.out, self.steps = device, out, steps
        self.deadline = time.monotonic() + budget_s
        self.scratch = Path(tempfile.mkdtemp(prefix="gpu_suite_"))
        self.log = open(out / LOG_NAME, "a", encoding="utf-8")
        self.result: dict = {"device": device, "started": time.strftime("%Y-%m-%d %H:%M:%S %Z"),
                             "budget_s": budget_s, "commit": _commit(), "steps": {}}
        self.t0 = time.monotonic()

    def say(self, msg: str) -> None:
        line = f"[gpu suite {time.monotonic() - self.t0:6.1f}s] {msg}"
        print(line, flush=True)
        self.log.write(line + "\n")
        self.log.flush()

    def run_step(self, step: Step) -> dict:
        left = self.deadline - time.monotonic()
        if left < MIN_STEP_S:
            return {"status": "skipped", "reason": f"out of time ({left:.0f} s of the budget left)", "seconds": 0.0}
        limit = int(min(step.timeout_s, left - 2))
        argv = list(step.argv)
        if shutil.which("timeout"):   # coreutils: signals the step's whole process group
            argv = ["timeout", "-k", str(KILL_AFTER_S), str(limit)] + argv
        env = {**os.environ, "PYTHONUNBUFFERED": "1"}
        if self.device == "cuda":
            env.pop("TRITON_INTERPRET", None)   # the compiled kernel, never the interpreter
        env["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH")) if p)
        stdout = self.scratch / f"{step.name}.out"
        self.log.write(f"\n===== {step.name}: {' '.join(step.argv)} (timeout {limit} s)\n")
        self.log.flush()
        start = self.log.tell()
        t = time.monotonic()
        try:
            with open(stdout, "w", encoding="utf-8") as so:
                rc = subprocess.run(argv, cwd=ROOT, env=env, stdout=so, stderr=self.log,
                                    timeout=limit + KILL_AFTER_S + 5).returncode
        except subprocess.TimeoutExpired:
            rc = 124
        seconds = round(time.monotonic() - t, 1)
        text = stdout.read_text(encoding="utf-8", errors="replace")
        self.log.seek(0, os.SEEK_END)
        self.log.write(text + f"\n===== {step.name}: exit {rc} after {seconds} s\n")
        self.log.flush()
        res = {"rc": rc, "seconds": seconds, "limit_s": limit}
        if rc in (124, 137):
            res.update(status="timeout", reason=f"ran past {limit} s")
        res.update(report.judge(step.kind, rc, text, self.out / JUNIT_NAME, res.get("status")))
        if res["status"] != "pass":   # the step's stderr and stdout, for the JSON and the console
            with open(self.out / LOG_NAME, "rb") as f:
                f.seek(start)
                res["output_tail"] = f.read()[-3000:].decode("utf-8", errors="replace")
            print(res["output_tail"], flush=True)
        return res

    def run(self) -> int:
        self.say(f"device {self.device}, out {self.out}, {len(self.steps)} steps, "
                 f"budget {self.deadline - time.monotonic():.0f} s")
        for step in self.steps:
            self.say(f"{step.name} ...")
            res = self.run_step(step)
            self.result["steps"][step.name] = res
            self.say(f"{step.name}: {res['status']} ({res.get('seconds', 0)} s) {res.get('summary', '')}")
            self.write()
        self.result["seconds"] = round(time.monotonic() - self.t0, 1)
        self.result["passed"] = all(r["status"] == "pass" for r in self.result["steps"].values())
        self.write()
        self.log.close()
        shutil.rmtree(self.scratch, ignore_errors=True)
        print(report.markdown(self.result))
        return 0 if self.result["passed"] else 1

    def write(self) -> None:
        for name, text in ((JSON_NAME, json.dumps(self.result, indent=2, allow_nan=False)),
                           (MD_NAME, report.markdown(self.result))):
            tmp = self.out / (name + ".tmp")
            tmp.write_text(text + "\n", encoding="utf-8")
            tmp.replace(self.out / name)


def _commit() -> str:
    try:
        q = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True,
                           timeout=10)
        return q.stdout.strip() or "unknown"
    except (OSError, subprocess.SubprocessError):
        return "unknown"


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if not args.out:
        print("bench/gpu/run.sh: error: give --out DIR (or set $OUT)", file=sys.stderr)
        return 2
    out = Path(args.out)
    try:
        out.mkdir(parents=True, exist_ok=True)
        for name in (JSON_NAME, MD_NAME, LOG_NAME, JUNIT_NAME):
            (out / name).unlink(missing_ok=True)   # a rerun into the same folder starts clean
    except OSError as exc:
        print(f"bench/gpu/run.sh: error: --out {args.out}: {exc.strerror}", file=sys.stderr)
        return 2
    steps = plan(args.device, (out / JUNIT_NAME).resolve(), tuple(args.tests))
    if args.steps:
        wanted = [s.strip() for s in args.steps.split(",") if s.strip()]
        unknown = sorted(set(wanted) - {s.name for s in steps})
        if unknown or not wanted:
            print(f"bench/gpu/run.sh: error: --steps {args.steps}: unknown {unknown}; "
                  f"known: {','.join(s.name for s in steps)}", file=sys.stderr)
            return 2
        steps = [s for s in steps if s.name in wanted]
    budget = args.budget_s if args.budget_s is not None else BUDGET_S[args.device]
    if not budget > 0:
        print(f"bench/gpu/run.sh: error: --budget-s {args.budget_s}: must be > 0", file=sys.stderr)
        return 2
    return Suite(args.device, out, steps, budget).run()


if __name__ == "__main__":
    sys.exit(main())
