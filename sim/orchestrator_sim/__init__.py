"""The simulated GPU host: hardware surface, SGLang stand-in, model hub and package index."""
