"""Hippo summariser: bounded session state (window + rolling summary)."""
