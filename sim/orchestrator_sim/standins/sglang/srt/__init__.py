"""SGLang runtime (stand-in)."""
