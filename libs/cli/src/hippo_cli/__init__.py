"""The `hippo` command: local launcher, health, and calls to the API."""
