"""ctxd: a long-running daemon that manages LLM conversation context."""

__version__ = "0.1.0"
