"""A tiny DeepSeek-V4-style attention stack (float64, CPU) for bit-exact cache proofs.

Interface:

* :class:`TinyV4Config`, :func:`layout_for` (the model's own :class:`CacheLayout`).
* :class:`TinyV4Model`: ``forward(tokens, start, cache)`` for one chunk, ``run`` for a
  chunk schedule with a callback at every page boundary.
* :class:`SequenceCache` (the seam), :class:`DenseSequenceCache` (reference, no reuse),
  :class:`PagedSequenceCache` (history in a tier's pools by page table; state snapshots
  in its state pool; ``resume`` from borrowed pages + a snapshot).
* :func:`reference_logits`, :func:`compare_logits`, :class:`LogitCheck`, ``TOLERANCE``.

See ``docs/tiny_model.md``. Imports :mod:`hicache.layout` and :mod:`hicache.pools`.
"""

from hicache.engine.tiny_model.cache import DenseSequenceCache, PagedSequenceCache, SequenceCache
from hicache.engine.tiny_model.check import TOLERANCE, LogitCheck, compare_logits, reference_logits
from hicache.engine.tiny_model.config import CSA_RATIO, TinyV4Config, layout_for
from hicache.engine.tiny_model.model import TinyV4Model
from hicache.engine.tiny_model.state import WorkingState, restore_rows, state_rows

__all__ = [
    "TinyV4Config", "layout_for", "CSA_RATIO",
    "TinyV4Model",
    "SequenceCache", "DenseSequenceCache", "PagedSequenceCache",
    "WorkingState", "state_rows", "restore_rows",
    "TOLERANCE", "LogitCheck", "compare_logits", "reference_logits",
]
