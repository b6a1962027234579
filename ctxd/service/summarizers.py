"""Which summarizer writes checkpoints, built once from ``[summarizer]``.

The extractive summarizer is always there, as the embedded default and as the
fallback behind an LLM backend; a backend is shared by all sessions (one HTTP
connection pool), with one chain per (encoding, model) because targets are counted in
the session's own tokens.
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import TYPE_CHECKING

from ctxd.config import Config
from ctxd.llm.base import BackendError, ChatBackend, ModelInfo
from ctxd.llm.settings import BackendSettings
from ctxd.tokens import TokenCounter

if TYPE_CHECKING:
    from ctxd.summarize import SummarizerChain

log = logging.getLogger(__name__)

MODEL_INFO_SECONDS = 60.0
"""How long the backend's answer about a model (an unknown model included) is reused: a
new session's ``session/create`` waited for an HTTP look-up each time (Ollama reads the
model's file for ``/api/show``), and agents open sessions in bursts; a changed
``num_ctx`` is seen within a minute."""


class Summarizers:
    def __init__(self, config: Config) -> None:
        self.config = config.summarizer
        self.backend: ChatBackend | None = None
        self.settings: BackendSettings | None = None
        if self.config.backend != "extractive":
            cfg = self.config
            self.settings = BackendSettings(
                kind=cfg.backend,  # type: ignore[arg-type]
                model=cfg.model or "",
                base_url=cfg.base_url or None,
                api_key_env=("" if cfg.api_key_env.lower() == "none" else cfg.api_key_env or None),
                api_key_file=cfg.api_key_file or None,
                timeout_seconds=cfg.timeout_seconds,
                max_retries=cfg.max_retries,
                context_window=cfg.context_window or None,
                max_response_bytes=cfg.max_response_bytes,
            )
            from ctxd.llm.factory import make_backend  # httpx loads only when a backend is used

            self.backend = make_backend(self.settings)
        self._chains: dict[tuple[str, str], SummarizerChain] = {}
        self._info_down: tuple[float, str] | None = None
        """When a model look-up last failed and why: look-ups are skipped for the cool-down."""
        self._info: dict[str, tuple[float, ModelInfo | None]] = {}
        """Per model: when the backend answered, and what (None: it does not know the model)."""

    @property
    def name(self) -> str:
        if self.settings is None:
            return "extractive"
        model = self.settings.model or "(session model)"
        return f"{self.settings.kind}:{model} -> extractive"

    def chain(self, counter: TokenCounter, session_model: str | None) -> SummarizerChain:
        model = (self.settings.model if self.settings else "") or session_model or ""
        key = (counter.encoding, model)
        chain = self._chains.get(key)
        if chain is None:
            # The summarizers load with the first compression, not at daemon start-up.
            from ctxd.summarize import ExtractiveSummarizer, LLMSummarizer, SummarizerChain

            extractive = ExtractiveSummarizer(counter.count)
            if self.backend is not None and self.settings is not None and model:
                settings = self.settings if self.settings.model == model else _with_model(self.settings, model)
                chain = SummarizerChain([LLMSummarizer(self.backend, settings, counter.count), extractive],
                                        counter.count, timeout_seconds=self.config.chain_timeout_seconds,
                                        cooldown_seconds=self.config.cooldown_seconds)
            else:
                chain = SummarizerChain([extractive], counter.count)
            self._chains[key] = chain
        return chain

    async def model_info(self, model: str) -> ModelInfo | None:
        """What the backend says about a session's model (None when it cannot be asked),
        the same answer for :data:`MODEL_INFO_SECONDS`.

        ``session/create`` waits for this, so it is bounded: one answer within
        ``model_info_timeout_seconds`` (retries included), and after a timeout or a failure
        the backend is not asked again for ``cooldown_seconds`` (a hung server would
        otherwise cost every create the whole timeout)."""
        if self.backend is None or not self.config.query_model_info:
            return None
        known = self._info.get(model)
        if known is not None and time.monotonic() - known[0] < MODEL_INFO_SECONDS:
            return known[1]
        cfg = self.config
        down = self._info_down
        if down is not None:
            ago = time.monotonic() - down[0]
            if ago < cfg.cooldown_seconds:
                log.debug("model info for %s not asked: the backend failed %.0fs ago (%s)", model, ago, down[1])
                return None
            self._info_down = None
        try:
            async with asyncio.timeout(cfg.model_info_timeout_seconds):
                info = await self.backend.model_info(model)
        except TimeoutError:
            why = f"no answer within {cfg.model_info_timeout_seconds:g}s"
        except BackendError as exc:
            if exc.kind not in ("unreachable", "timeout") and (exc.status or 0) < 500:
                # About this model or this answer (unknown model, odd JSON): not a dead backend.
                log.info("model info for %s unavailable: %s", model, exc)
                self._remember(model, None)
                return None
            why = str(exc)
        except Exception as exc:  # a bug here must not stop session creation
            log.exception("model info for %s failed", model)
            why = f"{type(exc).__name__}: {exc}"
        else:
            self._remember(model, info)
            return info
        self._info_down = (time.monotonic(), why)
        log.warning("model info for %s unavailable (%s); the window comes from the configuration or the built-in "
                    "table, and the backend is not asked again for %gs", model, why, cfg.cooldown_seconds)
        return None

    def _remember(self, model: str, info: ModelInfo | None) -> None:
        now = time.monotonic()
        if len(self._info) >= 256:  # (models come and go: the stale ones leave)
            self._info = {m: k for m, k in self._info.items() if now - k[0] < MODEL_INFO_SECONDS}
        self._info[model] = (now, info)

    async def aclose(self) -> None:
        if self.backend is not None:
            await self.backend.aclose()


def _with_model(settings: BackendSettings, model: str) -> BackendSettings:
    import msgspec

    return msgspec.structs.replace(settings, model=model)
