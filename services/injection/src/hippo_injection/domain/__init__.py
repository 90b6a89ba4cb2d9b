"""Injection domain: prompt format, validation, the model queue, generation. No grpc, no
generated code, no torch: the engine behind the `Engine` port owns the tensors."""
