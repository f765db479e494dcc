"""The worker's half of one vLLM step, by hand (no vLLM): what ``wait_for_layer_load``,
the attention and ``save_kv_layer`` do, layer by layer, for the bridge tests."""

from __future__ import annotations

from typing import Callable, Optional, Sequence


def worker_step(bridge, plan, copiers: Sequence[tuple], write: Optional[Callable[[int, int], None]] = None) -> None:
    """``copiers``: (KV cache group, BlockCopier, its layers' hicache layer ids) per family.
    Per layer: wait for the lease's layer and load, ``write(family index, layer)`` (the
    attention writing this step's KV), save; then ack every save."""
    for f, (g, copier, layer_ids) in enumerate(copiers):
        for layer, layer_id in enumerate(layer_ids):
            for op in plan.loads:
                assert bridge.wait_load(op.req, layer_id)
                copier.load(layer, op.pages[g], op.blocks[g])
            if write is not None:
                write(f, layer)
            for op in plan.saves:
                copier.save(layer, op.pages[g], op.blocks[g])
    bridge.report_saves([(op.key, True) for op in plan.saves])
