"""Embedding domain: validation, cache, micro-batching. No grpc, no generated code."""
