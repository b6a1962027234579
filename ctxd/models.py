"""What ctxd knows about models by name: context window and output limit.

Used when a session does not say its window and the backend cannot be asked.
Configuration (``[models]``) overrides this table; ``session/create`` overrides both.
Note that a local runtime's window is what it was started with (Ollama's ``num_ctx``),
not the model's maximum: set ``contextWindow`` for those sessions.
"""

from __future__ import annotations

from dataclasses import dataclass

# (prefix, context window, output limit). Longest matching prefix wins.
KNOWN_MODELS: tuple[tuple[str, int, int | None], ...] = (
    ("gpt-5", 400_000, 128_000),
    ("gpt-4.1", 1_047_576, 32_768),
    ("gpt-4o", 128_000, 16_384),
    ("chatgpt-4o", 128_000, 16_384),
    ("gpt-4-turbo", 128_000, 4_096),
    ("gpt-4-32k", 32_768, 4_096),
    ("gpt-4", 8_192, 8_192),
    ("gpt-3.5-turbo", 16_385, 4_096),
    ("gpt-oss", 131_072, 131_072),
    ("o1", 200_000, 100_000),
    ("o3", 200_000, 100_000),
    ("o4-mini", 200_000, 100_000),
    ("claude-3-haiku", 200_000, 4_096),
    ("claude-3-5-haiku", 200_000, 8_192),
    ("claude-3-5-sonnet", 200_000, 8_192),
    ("claude-3-7-sonnet", 200_000, 64_000),
    ("claude-sonnet-4", 200_000, 64_000),
    ("claude-opus-4", 200_000, 32_000),
    ("claude-haiku-4", 200_000, 64_000),
    ("llama3.1", 131_072, None),
    ("llama3.2", 131_072, None),
    ("llama3.3", 131_072, None),
    ("llama3", 8_192, None),
    ("llama2", 4_096, None),
    ("qwen2.5", 32_768, 8_192),
    ("qwen3", 40_960, None),
    ("mistral", 32_768, None),
    ("mixtral", 32_768, None),
    ("gemma3", 131_072, 8_192),
    ("gemma2", 8_192, None),
    ("phi3", 4_096, None),
    ("phi4", 16_384, None),
    ("deepseek-chat", 65_536, 8_192),
    ("deepseek-reasoner", 65_536, 32_768),
    ("deepseek-r1", 131_072, None),
)


@dataclass(frozen=True)
class ModelFacts:
    context_window: int | None
    output_limit: int | None
    source: str


def _match(table: dict[str, int] | tuple, name: str):
    best = None
    items = table.items() if isinstance(table, dict) else ((row[0], row[1:]) for row in table)
    for prefix, value in items:
        if name.startswith(prefix.lower()) and (best is None or len(prefix) > len(best[0])):
            best = (prefix, value)
    return best


def model_facts(
    model: str | None,
    windows: dict[str, int] | None = None,
    output_limits: dict[str, int] | None = None,
) -> ModelFacts:
    """Window and output limit for ``model``: configuration first, then the table."""
    if not model:
        return ModelFacts(None, None, "unknown")
    name = model.lower().split("/")[-1]
    window = output = None
    source = "unknown"
    configured = _match(windows or {}, name)
    known = _match(KNOWN_MODELS, name)
    if configured:
        window, source = configured[1], "config"
    elif known:
        window, source = known[1][0], "table"
    configured_out = _match(output_limits or {}, name)
    if configured_out:
        output = configured_out[1]
    elif known:
        output = known[1][1]
    return ModelFacts(window, output, source)
