"""The memtok store and the per-query influence pipeline (docs/memtok.md)."""
