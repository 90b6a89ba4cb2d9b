"""Model backends: transformers (torch) with forward hooks for influence."""
