"""Hippo injection service: an LLM host with residual-stream influence."""
