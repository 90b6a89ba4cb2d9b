"""Hippo embedding service: text to all-MiniLM-L6-v2 vectors over gRPC."""
