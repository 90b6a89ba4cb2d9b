"""The gRPC server runtime: interceptors, request decoding, and the serve loop."""
