"""Model backends behind the `Encoder` port: the encoders library's loader (libs/encoders),
which the gateway uses too."""

from __future__ import annotations

from hippo_encoders.loading import load, load_all, load_spec
from hippo_encoders.specs import BUILTIN_NAME

MODEL = BUILTIN_NAME

__all__ = ["MODEL", "load", "load_all", "load_spec"]
