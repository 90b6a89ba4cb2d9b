"""Gateway domain: auth, validation, ids, the memory use cases. No grpc, no generated code."""
