"""Storage and crypto behind the audit domain's ports: SQLite, witness file, keys."""
