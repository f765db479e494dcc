from __future__ import annotations

import pytest
import torch


@pytest.fixture(autouse=True)
def one_torch_thread():
    """The model's tensors are tiny: intra-op threads only add barrier waits, and on a
    shared 2-core machine those waits made decode 4x slower. Restored after each test."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)
