"""The reference serving loop that embeds HiCache (what ``hicache replay`` runs) and its workloads."""
