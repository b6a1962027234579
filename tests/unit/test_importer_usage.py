"""Provider usage read from transcripts: input + cache reads is what the provider counted."""

from __future__ import annotations

from ctxd.formats.native import any_usage


def test_openai_and_deepseek_cached_tokens_are_inside_prompt_tokens():
    raw = {"prompt_tokens": 5401, "completion_tokens": 137, "total_tokens": 5538,
           "prompt_tokens_details": {"cached_tokens": 5120}, "prompt_cache_hit_tokens": 5120}
    usage = any_usage(raw)
    assert usage is not None
    assert usage.input_tokens == 5401 and usage.cache_read_tokens is None


def test_anthropic_cache_reads_are_beside_input_tokens():
    usage = any_usage({"input_tokens": 3, "output_tokens": 90, "cache_read_input_tokens": 15289,
                        "cache_creation_input_tokens": 3257})
    assert usage is not None
    assert (usage.input_tokens, usage.cache_read_tokens, usage.cache_write_tokens) == (3, 15289, 3257)
