"""Pure domain code: no grpc, no generated messages."""
