"""Token sequences as the cache sees them: 1-D int32, every id in ``[0, 2**31)``."""

from __future__ import annotations

import numpy as np

from hicache.errors import MisuseError

TOKEN_LIMIT = 2 ** 31  # token ids are hashed and compared as int32


def as_tokens(tokens: object) -> np.ndarray:
    """``tokens`` as a contiguous int32 array, or :class:`MisuseError`.

    Ids must be integers in ``[0, 2**31)``: the tree and the page hashes see int32, so a
    larger id would wrap and two different prompts would alias (and share KV).
    """
    arr = np.asarray(tokens)
    if arr.ndim != 1 or (arr.size and (arr.dtype == np.bool_ or not np.issubdtype(arr.dtype, np.integer))):
        raise MisuseError(f"tokens must be a 1-D sequence of integers, got shape {arr.shape} {arr.dtype}")
    if arr.size and arr.dtype != np.int32:
        lo, hi = int(arr.min()), int(arr.max())
        if lo < 0 or hi >= TOKEN_LIMIT:
            bad = lo if lo < 0 else hi
            raise MisuseError(f"token id {bad} is outside [0, 2**31)")
    elif arr.size and int(arr.min()) < 0:
        raise MisuseError(f"token id {int(arr.min())} is outside [0, 2**31)")
    return np.ascontiguousarray(arr, dtype=np.int32)
