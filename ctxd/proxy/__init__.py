"""``ctxd proxy``: an HTTP proxy for agents that speak the OpenAI Chat Completions,
Anthropic Messages or Ollama chat API. Each request's conversation is pushed to a ctxd
session and the upstream receives ctxd's prompt for it; see docs/proxy.md."""
