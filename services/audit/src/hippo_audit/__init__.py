"""Hippo audit service: the append-only, hash-chained, verifiable log of memory decisions."""
