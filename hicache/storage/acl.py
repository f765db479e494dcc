"""The Redis ACL rules hicache needs, per role: least privilege for a shared server.

Why. Any client that may write to the keys hicache reads can plant KV bytes (authenticated
objects, :mod:`hicache.storage.auth`, stop those being served) or delete and flush them;
any client that may read them can learn which prefixes a fleet serves. So hicache's
connections should hold exactly what they use, and nobody else should hold write access to
``hc1.*``. What each role sends (``grep`` the storage modules to re-derive it):

* engine (read-write): ``GET`` / ``SET`` / ``EXISTS`` / ``DEL`` (the pipelined data path,
  ``resp.py``, ``redis_node.py``; ``DEL`` repairs a rejected value) and ``INFO`` (store stats,
  ``redis_node.py``); on a cluster also ``CLUSTER SLOTS`` (redis-py reads the slot map),
  ``COMMAND`` (redis-py's key-position parser) and ``ASKING`` (a slot in migration).
* operator (``hicache l3 stats|scan|purge``): ``SCAN`` + ``STRLEN`` (listing), ``GET``
  (scan reads a sample back), ``DEL`` (purge), ``INFO``; on a cluster the same three.

Keys: ``~hc1.*`` only (every key hicache writes starts with ``hc1.``: ``objects.KEY_PREFIX``);
no pub/sub channels. ``AUTH`` needs no permission; ``SELECT`` is not sent for database 0
(another database needs ``+select``). ``tests/storage/test_redis_acl.py`` runs the L3 tests
as users holding exactly these rules, and as users lacking them.
"""

from __future__ import annotations

from hicache.errors import MisuseError

KEY_PATTERN = "~hc1.*"
ROLES = {
    "engine": ("get", "set", "exists", "del", "info"),
    "operator": ("scan", "strlen", "get", "del", "info"),
}
CLUSTER_EXTRA = ("cluster|slots", "command", "asking")


def acl_rule(role: str, *, cluster: bool = False) -> str:
    """The ``ACL SETUSER name on >password <rule>`` rule of ``role`` (``engine``, ``operator``)."""
    if role not in ROLES:
        raise MisuseError(f"ACL role must be one of {sorted(ROLES)}, got {role!r}")
    cmds = ROLES[role] + (CLUSTER_EXTRA if cluster else ())
    return " ".join([KEY_PATTERN, "resetchannels", "-@all", *(f"+{c}" for c in cmds)])
