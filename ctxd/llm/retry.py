"""The one retry loop every backend goes through.

Retried: connection failures, timeouts, dropped connections, HTTP 408, 429 and 5xx.
Not retried: any other 4xx, because the same request would fail the same way (a bad
key, an unknown model, a prompt the server refuses). Waits grow exponentially with
jitter up to a cap; a ``Retry-After`` the server sends is honoured when it is short, and
a long one ends the attempts at once (a compression should fall back to the extractive
summarizer rather than hang for minutes). ``asyncio.CancelledError`` is never caught:
cancelling the caller's task aborts the request in flight and closes its connection.
"""

from __future__ import annotations

import asyncio
import email.utils
import logging
import random
import time
from collections.abc import Awaitable, Callable

import httpx
import msgspec

from ctxd.llm.base import BackendError

log = logging.getLogger("ctxd.llm")

_RETRY_STATUSES = frozenset({408, 429})


class RetryPolicy(msgspec.Struct, frozen=True):
    """How many times and how patiently to retry."""

    max_retries: int = 2
    backoff_seconds: float = 0.5
    backoff_max_seconds: float = 8.0
    retry_after_max_seconds: float = 20.0
    attempt_timeout_seconds: float = 65.0

    def delay(self, retry_number: int, rng: random.Random) -> float:
        """Exponential backoff with jitter (50-100% of the capped step)."""
        step = min(self.backoff_max_seconds, self.backoff_seconds * (2 ** retry_number))
        return step * rng.uniform(0.5, 1.0)


def is_retryable_status(status: int) -> bool:
    return status in _RETRY_STATUSES or 500 <= status <= 599


def parse_retry_after(value: str | None) -> float | None:
    """Seconds to wait from a ``Retry-After`` header (delta-seconds or HTTP date)."""
    if not value:
        return None
    value = value.strip()
    try:
        return max(0.0, float(value))
    except ValueError:
        pass
    try:
        when = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return None
    return max(0.0, when.timestamp() - time.time())


async def send_with_retry(
    send: Callable[[], Awaitable[httpx.Response]],
    policy: RetryPolicy,
    *,
    describe: str,
    error_detail: Callable[[httpx.Response], str],
    redact: Callable[[str], str],
    rng: random.Random | None = None,
) -> httpx.Response:
    """Call ``send`` until it yields a 2xx response or the policy says stop.

    ``describe`` names the call in messages ("ollama POST /api/chat"); ``error_detail``
    pulls the server's own error text out of a failed response; ``redact`` scrubs secrets
    from every message before it leaves this function.
    """
    rng = rng or random.Random()
    attempts = 0
    while True:
        attempts += 1
        retry_after: float | None = None
        started = time.monotonic()
        try:
            async with asyncio.timeout(policy.attempt_timeout_seconds):
                response = await send()
        except (TimeoutError, httpx.TimeoutException):
            error = BackendError("timeout", redact(
                f"{describe}: no answer within {policy.attempt_timeout_seconds:g}s"), attempts=attempts)
        except httpx.ConnectError as exc:
            error = BackendError("unreachable", redact(f"{describe}: cannot connect ({_short(exc)})"),
                                 attempts=attempts)
        except (httpx.RemoteProtocolError, httpx.ReadError, httpx.WriteError) as exc:
            error = BackendError("unreachable", redact(
                f"{describe}: connection dropped ({type(exc).__name__}: {_short(exc)})"), attempts=attempts)
        except httpx.TransportError as exc:
            error = BackendError("unreachable", redact(f"{describe}: {type(exc).__name__}: {_short(exc)}"),
                                 attempts=attempts)
        except RuntimeError as exc:
            # httpx raises RuntimeError once its client was closed by aclose().
            if "closed" not in str(exc):
                raise
            raise BackendError("cancelled", f"{describe}: backend was closed", attempts=attempts) from None
        else:
            elapsed = time.monotonic() - started
            log.debug("%s -> HTTP %d in %.2fs (attempt %d)", describe, response.status_code, elapsed, attempts)
            if response.is_success:
                return response
            status = response.status_code
            detail = redact(error_detail(response))
            error = BackendError("http_status", f"{describe}: HTTP {status}" + (f": {detail}" if detail else ""),
                                 status=status, attempts=attempts)
            if not is_retryable_status(status):
                raise error
            retry_after = parse_retry_after(response.headers.get("retry-after"))
            if retry_after is not None and retry_after > policy.retry_after_max_seconds:
                error.message = f"{error.message} (server asks to retry after {retry_after:g}s; not waiting)"
                error.args = (error.message,)
                raise error
        if attempts > policy.max_retries:
            raise error
        wait = retry_after if retry_after is not None else policy.delay(attempts - 1, rng)
        log.info("%s failed (%s); retry %d/%d in %.2fs", describe, error.message, attempts,
                 policy.max_retries, wait)
        await asyncio.sleep(wait)


def _short(exc: BaseException) -> str:
    text = str(exc) or type(exc).__name__
    return text if len(text) <= 200 else text[:200] + "…"
