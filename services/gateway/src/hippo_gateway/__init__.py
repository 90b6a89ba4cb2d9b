"""Hippo gateway: the public Memory API."""
