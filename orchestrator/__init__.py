"""orchestrator: deploy an SGLang LLM server onto GPU hosts over SSH, and keep it there."""

__version__ = "0.1.0"
