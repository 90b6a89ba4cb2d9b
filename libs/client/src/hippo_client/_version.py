"""The SDK's version, sent in the user agent."""

__version__ = "0.1.0"
