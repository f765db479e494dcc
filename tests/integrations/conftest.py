"""``sglang_engine/`` holds tests that drive SGLang's own HiCache controller; they need the
SGLang venv and run there, as a subprocess started by ``test_sglang_engine.py`` (which sets
``HICACHE_SGLANG_INNER=1``). The main run does not collect them itself."""

import os

collect_ignore = [] if os.environ.get("HICACHE_SGLANG_INNER") == "1" else ["sglang_engine"]
