"""Adapters: SQLite session store, CountTokens client, TGI client."""
