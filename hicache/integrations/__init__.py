"""Adapters that plug hicache into serving engines.

Each engine gets a subpackage (``hicache.integrations.sglang``, ...) that imports the
engine only when its adapter class is first used, so ``import hicache`` never needs an
engine installed. See ``docs/integrations.md``.
"""
