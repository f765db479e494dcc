"""Where a prompt's last chunk ends on its sharing grain (hicache.tree.retention.grain_end)."""

import pytest

from hicache.tree import Boundary, grain_end

P = 256


@pytest.mark.parametrize("done, target, why, prompt, grain, expect", [
    (0, 900, Boundary.PROMPT_END, 900, 512, (512, Boundary.GRAIN)),      # 512 < last page boundary 768
    (512, 900, Boundary.PROMPT_END, 900, 512, (900, Boundary.PROMPT_END)),  # already there
    (0, 1024, Boundary.PROMPT_END, 1024, 512, (1024, Boundary.PROMPT_END)),  # the grain is the last page boundary
    (0, 1100, Boundary.PROMPT_END, 1100, 512, (1100, Boundary.PROMPT_END)),  # 1024 is its last page boundary
    (0, 1300, Boundary.PROMPT_END, 1300, 400, (1024, Boundary.GRAIN)),   # 1200 rounded down to a page
    (0, 900, Boundary.PROMPT_END, 900, 256, (900, Boundary.PROMPT_END)),  # no coarser than a page
    (0, 900, Boundary.PROMPT_END, 900, 0, (900, Boundary.PROMPT_END)),    # off
    (0, 768, Boundary.PREFILL, 900, 512, (768, Boundary.PREFILL)),        # only the prompt's last chunk
    (0, 500, Boundary.BRANCH, 900, 512, (500, Boundary.BRANCH)),
])
def test_the_last_chunk_ends_first_at_the_prompts_last_boundary_on_the_grain(done, target, why, prompt, grain,
                                                                            expect):
    assert grain_end(done, target, why, prompt, grain, P) == expect
