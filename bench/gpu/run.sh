#!/usr/bin/env bash
# The GPU suite (issue 28) in one command, from this checkout as it is: no install, no
# network. On the GPU machine:   bash bench/gpu/run.sh --out "$OUT"
# CPU dry run (CI):               bash bench/gpu/run.sh --device cpu --out DIR
# Writes gpu_suite.json, gpu_suite.md, gpu_suite.log and gpu_suite_tests.xml under the out
# folder; exit status 0 only when every step passed. See bench/gpu/suite.py and bench/README.md.
set -u
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
root="$(cd "$here/../.." && pwd)"
# This tree first, before any installed hicache (an editable install may point elsewhere).
export PYTHONPATH="$root${PYTHONPATH:+:$PYTHONPATH}"
export PYTHONUNBUFFERED=1
cd "$root" || exit 2
exec "${PYTHON:-python3}" -m bench.gpu.suite "$@"
