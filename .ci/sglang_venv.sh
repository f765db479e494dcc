#!/usr/bin/env bash
# Builds (or reuses) the venv that tests/integrations/test_sglang_engine.py runs SGLang's
# own HiCache controller in: SGLang 0.5.23 pins another torch and a long import chain, so it
# gets a venv of its own (../shared/tools/setup_sglang_venv.sh: ~2 min, ~2.5 GB), plus
# hicache's few runtime deps, redis-py + hiredis (the `redis` extra: hicache's Redis
# connections), pytest, hypothesis, and this checkout installed without deps.
# Usage: .ci/sglang_venv.sh [VENV]   (default: $HICACHE_SGLANG_VENV, else ../venvs/sglang)
# Last line: the venv path, or nothing when it cannot be built (the tests then skip).
set -euo pipefail
cd "$(dirname "$0")/.."
VENV="${1:-${HICACHE_SGLANG_VENV:-$(cd .. && pwd)/venvs/sglang}}"
SETUP=../shared/tools/setup_sglang_venv.sh
export PIP_DISABLE_PIP_VERSION_CHECK=1 PIP_ROOT_USER_ACTION=ignore
if "$VENV/bin/python" -c "import sglang, xxhash, yaml, psutil, pytest, hypothesis" >/dev/null 2>&1; then
    echo "SGLang venv: reusing $VENV" >&2
elif [ -x "$SETUP" ]; then
    start=$(date +%s)
    "$SETUP" "$VENV" >&2
    "$VENV/bin/pip" install -q xxhash==4.1.0 pyyaml psutil pytest==9.0.3 hypothesis==6.155.2 >&2
    echo "SGLang venv: built $VENV in $(( $(date +%s) - start )) s" >&2
else
    echo "SGLang venv: $SETUP not found; the SGLang engine tests will skip" >&2
    exit 0
fi
# Also on a reused venv (one built before hicache's Redis URLs needed redis-py).
"$VENV/bin/pip" install -q redis==8.1.0 hiredis==3.5.0 >&2
"$VENV/bin/pip" install -q --no-deps -e . >&2
echo "$VENV"
