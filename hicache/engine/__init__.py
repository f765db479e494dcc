"""Reference serving loop pieces that embed :class:`hicache.HiCache` the way an engine would."""
