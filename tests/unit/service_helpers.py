"""Helpers of the in-process service tests: params as the server decodes them, chats,
and waiting for the background work a request started."""

from __future__ import annotations

import asyncio
from typing import Any

import msgspec

from ctxd.protocol.methods import METHODS
from ctxd.service.core import Service


def params(method: str, **raw: Any) -> Any:
    """``method``'s params Struct from wire-shaped fields (``sessionId=...``)."""
    return msgspec.convert(raw, METHODS[method].params)


def chat(start: int, turns: int, *, answer_words: int = 20) -> list[dict[str, Any]]:
    """``turns`` question/answer pairs, numbered from ``start``."""
    out: list[dict[str, Any]] = []
    for i in range(start, start + turns):
        out.append({"role": "user", "content": f"question {i}: why is the sky blue at hour {i}?"})
        out.append({"role": "assistant",
                    "content": f"answer {i}: " + " ".join(f"scattering{i}x{k}" for k in range(answer_words))})
    return out


async def settle(svc: Service) -> None:
    """Wait until the background work requests started (compression passes) is done."""
    while svc.tasks:
        await asyncio.gather(*list(svc.tasks), return_exceptions=True)
