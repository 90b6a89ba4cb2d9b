"""Clients of the peer services (embedding, retrieval)."""
