"""Every named workload (trace family), so one name builds the same requests in
``python -m hicache.engine.workloads NAME``, ``hicache replay --workload NAME`` and
``hicache sweep --workload NAME``.

A family is judged by where its next request resumes -- through the previous output (chat,
agent steps, RAG follow-ups), at the previous prompt's end (reasoning), at a shared
instruction or system prompt (RAG questions, API requests), or nowhere -- so the families
differ in that first of all (``docs/workloads.md`` has the table).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

from hicache.engine.workloads.mix import MixSpec, mix
from hicache.engine.workloads.production import production
from hicache.engine.workloads.rag import rag
from hicache.engine.workloads.reasoning import reasoning
from hicache.engine.workloads.request import Request
from hicache.engine.workloads.sharegpt import sharegpt
from hicache.engine.workloads.synthetic import synthetic
from hicache.errors import ConfigError


@dataclass(frozen=True)
class Family:
    """A named workload: ``build(n, seed)``, where ``n`` counts ``unit``s."""

    name: str
    unit: str
    resumes: str
    build: Callable[[int, int], list[Request]]


def _preset(name: str) -> Callable[[int, int], list[Request]]:
    return lambda n, seed: synthetic(n, seed, preset=name)


FAMILIES: dict[str, Family] = {f.name: f for f in (
    Family("chat", "conversations", "through the previous output", _preset("chat")),
    Family("multi-turn", "conversations", "through the previous output", _preset("multi-turn")),
    Family("long-context", "conversations", "through the previous output", _preset("long-context")),
    Family("long-revisit", "conversations", "through the previous output", _preset("long-revisit")),
    Family("agentic", "tasks", "through the previous call; at the agent prompt", _preset("agentic")),
    Family("sharegpt", "conversations", "through the previous output; at the system prompt",
           lambda n, seed: sharegpt(n, seed)),
    Family("sharegpt-nosys", "conversations", "through the previous output; first turns nowhere",
           lambda n, seed: sharegpt(n, seed, system_prompt="")),
    Family("reasoning", "conversations", "at the previous prompt's end", lambda n, seed: reasoning(n, seed)),
    Family("rag", "sessions", "at the instruction (+ leading documents); follow-ups through the output",
           lambda n, seed: rag(n, seed)),
    Family("mix", "units", "as each unit's family does; bursty arrivals", lambda n, seed: mix(n, seed)),
    Family("mix-poisson", "units", "as each unit's family does; Poisson arrivals",
           lambda n, seed: mix(n, seed, spec=MixSpec(arrival_process="poisson"))),
    Family("production", "requests", "at a system prompt or the previous prompt's full blocks; mostly nowhere",
           lambda n, seed: production(n, seed)),
)}


def build_family(name: str, n: int, seed: int) -> list[Request]:
    """The requests of family ``name`` with ``n`` units (its ``unit``) and ``seed``."""
    family = FAMILIES.get(name)
    if family is None:
        raise ConfigError("workload", name, f"must be one of {sorted(FAMILIES)}")
    return family.build(n, seed)
