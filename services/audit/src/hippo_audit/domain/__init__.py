"""Audit domain: entries, the hash chain, checkpoints, the log's use cases. No grpc."""
