"""Retrieval domain: models, ports and fusion. No grpc, no generated code."""
