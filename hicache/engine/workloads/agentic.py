"""Agentic / RL-rollout traffic: long shared tool prompts, tasks that branch into rollouts.

This is the shape of GRPO-style rollout generation and of agent serving: a handful of long
"agent" system prompts (tool schemas, instructions) shared by every task; each task adds its
description and is sampled ``G`` times (the group of rollouts, arriving together); every
rollout is an agent trajectory of ``K`` steps, each step's prompt being the previous step's
prompt, the model's tool call and the tool's result::

    <bos><system> agent prompt s <eot> <user> task t <eot> <assistant> | call 0 <eot>
                                                                       | <tool> result 0 <eot> <assistant> | call 1 <eot> ...
    |---------------- shared by the G rollouts of task t -----------|
    |-- shared by every task on prompt s --|

So the prefix tree has three levels: agent prompts (few, 2K-8K tokens, hit by every task),
tasks (one per group, hit by its G rollouts), and rollouts (private branches that extend
themselves step after step, like multi-turn conversations). Step 0 of a task's rollouts is
the same prompt G times (n-sampling); the branches diverge at the first decoded token.

Divergence is exact, not left to chance: agent prompts start with distinct tokens, a task's
first token is a function of its index (distinct for up to ``vocab - 16`` tasks) and the G
rollouts of a task start their first call with distinct tokens, so two rollouts share
exactly the agent prompt + task prefix and two tasks on one agent prompt share exactly that
prompt and the ``<user>`` header. Shared parts are the same array copied, byte-identical.

A rollout is a conversation (``conversation_id`` ``agent-<task>-<g>``, one turn per step):
the engine holds step k+1 until step k has finished, as for any multi-turn conversation.
Arrivals: tasks start as a Poisson process of ``arrival_rate`` per second, a task's rollouts
start within ``rollout_spread_s`` of it, and step k+1 arrives an exponential
``think_time_s`` after step k (model time + tool time), so several tasks' trees are live at
once.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from hicache.engine.workloads._checks import Range, check_int, check_range, draw
from hicache.engine.workloads._random import stream
from hicache.engine.workloads.request import ArrivalSpec, Conversation, Request, poisson_starts, schedule
from hicache.engine.workloads.tokenizer import (ASSISTANT, BOS, DEFAULT_VOCAB, EOT, FIRST_TEXT_ID,
                                                SYSTEM, TOOL, USER)
from hicache.errors import ConfigError


@dataclass(frozen=True)
class AgenticSpec:
    """Shape of the agentic workload. Ranges are inclusive ``(low, high)``; token counts
    are text tokens (template tokens come on top).

    ``system_prompts``: how many agent prompts the seed draws; ``rollouts``: G per task;
    ``steps``: K per rollout; ``call_len``: the model's output per step (tool call, or the
    final answer); ``result_len``: the tool result appended before the next step.
    """

    system_prompts: Range = (3, 6)
    system_len: Range = (2048, 8192)
    task_len: Range = (200, 1500)
    rollouts: Range = (2, 8)
    steps: Range = (2, 10)
    call_len: Range = (50, 400)
    result_len: Range = (100, 2000)
    vocab_size: int = DEFAULT_VOCAB
    arrival_rate: float | None = 0.1
    rollout_spread_s: float = 0.5
    think_time_s: float = 8.0

    def __post_init__(self) -> None:
        for name, minimum in (("system_prompts", 1), ("system_len", 1), ("task_len", 1), ("rollouts", 1),
                              ("steps", 1), ("call_len", 1), ("result_len", 0)):
            object.__setattr__(self, name, check_range(name, getattr(self, name), minimum))
        check_int("vocab_size", self.vocab_size, FIRST_TEXT_ID + 2)
        ArrivalSpec(self.arrival_rate, self.think_time_s, None)  # validates them
        s = self.rollout_spread_s
        if isinstance(s, bool) or not isinstance(s, (int, float)) or not 0 <= s < float("inf"):
            raise ConfigError("rollout_spread_s", s, "must be a number of seconds >= 0")
        for name in ("system_prompts", "rollouts"):
            if getattr(self, name)[1] > self.text_ids:
                raise ConfigError(name, list(getattr(self, name)),
                                  f"cannot exceed the {self.text_ids} text ids (their first tokens are distinct)")

    @property
    def text_ids(self) -> int:
        return self.vocab_size - FIRST_TEXT_ID

    @property
    def arrivals(self) -> ArrivalSpec:
        return ArrivalSpec(self.arrival_rate, self.think_time_s, None)

    def longest_prompt(self) -> int:
        """The longest prompt the spec can produce (the last step of the longest rollout)."""
        k = self.steps[1]
        return (3 + self.system_len[1]) + (3 + self.task_len[1]) + (k - 1) * (self.call_len[1] + 1) \
            + (k - 1) * (self.result_len[1] + 3)


def _text(rng: np.random.Generator, n: int, vocab: int, head: int | None = None) -> np.ndarray:
    """``n`` random text ids; the first is ``head`` when given (a branch's distinct start)."""
    out = rng.integers(FIRST_TEXT_ID, vocab, size=n, dtype=np.int32)
    if head is not None and n:
        out[0] = head
    return out


def _heads(rng: np.random.Generator, n: int, spec: AgenticSpec) -> np.ndarray:
    """``n`` distinct text ids."""
    return FIRST_TEXT_ID + rng.choice(spec.text_ids, size=n, replace=False)


def agent_prompts(spec: AgenticSpec, seed: int) -> list[np.ndarray]:
    """The seed's agent prompts, each ``<bos><system> text <eot>``; texts start with distinct ids."""
    rng = stream(seed, "agentic", "systems")
    n = draw(rng, spec.system_prompts)
    heads = _heads(rng, n, spec)
    return [np.concatenate([np.array([BOS, SYSTEM], np.int32),
                            _text(rng, draw(rng, spec.system_len), spec.vocab_size, int(heads[s])),
                            np.array([EOT], np.int32)]) for s in range(n)]


def _task(spec: AgenticSpec, seed: int, t: int, prompts: list[np.ndarray], task_head_offset: int) -> list[Conversation]:
    """Task ``t``'s G rollouts as conversations (ids ``agent-t-g``)."""
    rng = stream(seed, "agentic", "task", t)
    v = spec.vocab_size
    system = prompts[int(rng.integers(len(prompts)))]
    head = FIRST_TEXT_ID + (t + task_head_offset) % spec.text_ids
    shared = np.concatenate([system, np.array([USER], np.int32), _text(rng, draw(rng, spec.task_len), v, head),
                             np.array([EOT, ASSISTANT], np.int32)])
    n_rollouts = draw(rng, spec.rollouts)
    call_heads = _heads(rng, n_rollouts, spec)
    out = []
    for g in range(n_rollouts):
        r = stream(seed, "agentic", "rollout", t, g)
        parts, turns, length = [shared], [], len(shared)
        for k in range(draw(r, spec.steps)):
            if k > 0:  # the previous call's tool result, then the model's turn again
                result = _text(r, draw(r, spec.result_len), v)
                parts += [np.array([TOOL], np.int32), result, np.array([EOT, ASSISTANT], np.int32)]
                length += len(result) + 3
            call = _text(r, draw(r, spec.call_len), v, int(call_heads[g]) if k == 0 else None)
            parts += [call, np.array([EOT], np.int32)]
            turns.append((length, length + len(call) + 1))
            length += len(call) + 1
        tokens = np.concatenate(parts)
        assert len(tokens) == length, f"agentic task {t} rollout {g}: {len(tokens)} != {length}"
        out.append(Conversation(f"agent-{t}-{g}", tokens, tuple(turns)))
    return out


def rollout_offsets(spec: AgenticSpec, seed: int, t: int, rollouts: int) -> list[float]:
    """When task ``t``'s rollouts start, from the task's start: within the spread, the first at 0."""
    spread = stream(seed, "arrivals", "spread", t).uniform(0.0, spec.rollout_spread_s, size=rollouts)
    spread[:1] = 0.0  # the first rollout arrives with its task
    return [float(x) for x in spread]


def task_unit(spec: AgenticSpec, seed: int, t: int, prompts: list[np.ndarray],
              task_head_offset: int) -> list[tuple[Conversation, float]]:
    """Task ``t``'s rollouts with their start offsets (a unit of the ``mix`` workload)."""
    rollouts = _task(spec, seed, t, prompts, task_head_offset)
    return list(zip(rollouts, rollout_offsets(spec, seed, t, len(rollouts))))


def task_head_offset(spec: AgenticSpec, seed: int) -> int:
    """The seed's offset of task heads (task t's first text token is a function of t + it)."""
    return int(stream(seed, "agentic", "task-heads").integers(spec.text_ids))


def _starts(spec: AgenticSpec, seed: int, groups: list[int]) -> list[float]:
    """Start time of every rollout: tasks Poisson, a task's rollouts within the spread."""
    task_starts = poisson_starts(len(groups), spec.arrival_rate, seed)
    out = []
    for t, g in enumerate(groups):
        out += [float(task_starts[t] + x) for x in rollout_offsets(spec, seed, t, g)]
    return out


def agentic(tasks: int = 100, seed: int = 0, *, spec: AgenticSpec | None = None) -> list[Request]:
    """``tasks`` tasks of G rollouts of K steps, one request per step, sorted by arrival.

    The same arguments give the same requests in every process; task ``t``'s rollouts do not
    depend on how many tasks are drawn.
    """
    spec = AgenticSpec() if spec is None else spec
    check_int("conversations", tasks, 1)
    check_int("seed", seed, 0)
    if tasks > spec.text_ids:
        raise ConfigError("conversations", tasks, f"agentic tasks cannot exceed {spec.text_ids} "
                                                  "(their first tokens are distinct)")
    prompts = agent_prompts(spec, seed)
    offset = task_head_offset(spec, seed)
    convs: list[Conversation] = []
    groups = []
    for t in range(tasks):
        rollouts = _task(spec, seed, t, prompts, offset)
        groups.append(len(rollouts))
        convs += rollouts
    return schedule(convs, spec.arrivals, seed, starts=_starts(spec, seed, groups))
