"""Version of this SGLang stand-in (the wheel builder overwrites this file)."""

__version__ = "0.0.0"
