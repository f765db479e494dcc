"""A ghost's page keys (hicache.tree.ghost_nodes)."""

import numpy as np

from hicache.tree.ghost_nodes import page_keys


def test_page_keys_chain_the_prefix():
    t = np.arange(40, dtype=np.int32)
    u = t.copy()
    u[25] = 999                                  # differs in page 2 (tokens 20-29)
    a, b = page_keys(t, 10, 4), page_keys(u, 10, 4)
    assert a[:2] == b[:2] and a[2] != b[2] and a[3] != b[3]
    assert page_keys(t, 10, 2) == a[:2] and page_keys(t, 10, 0) == []


def test_a_tenants_root_key_gives_other_keys_and_the_token_dtype_does_not_matter():
    t = np.arange(30, dtype=np.int32)
    a, b = page_keys(t, 10, 3, root=7), page_keys(t, 10, 3)
    assert all(x != y for x, y in zip(a, b))      # no page shared between tenants
    # keys hash the tokens as little-endian int32, whatever array they came in
    assert page_keys(t.astype(np.int64), 10, 3) == b
