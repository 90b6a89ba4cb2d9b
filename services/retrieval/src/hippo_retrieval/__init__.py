"""Hippo retrieval service: durable turns, BM25 and vector indexes, hybrid search.

Work in progress (issue 3): the domain model, ports and fusion are here with their
adapters; the gRPC servicer and the gateway's Remember/Recall/Forget come next.
"""
