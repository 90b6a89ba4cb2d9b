"""hippo_core: the runtime every Hippo service shares.

Domain code may import `errors` and `context` only; everything else here is transport
and infrastructure (grpc, metrics, logs, tracing) used by servicers and `__main__`.
"""
