"""The Starlette application: the chat endpoints (OpenAI Chat Completions and Responses,
Anthropic Messages, Ollama chat), count_tokens, and pass-through.

Nothing here parses HTTP: Starlette/uvicorn serve the client, httpx talks to the
upstream. Request headers are forwarded as the client sent them (credentials included)
and never logged; ``X-Ctxd-*`` headers are the proxy's own and are not forwarded.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterator
from typing import Any, Literal

import httpx
from starlette.applications import Starlette
from starlette.background import BackgroundTask
from starlette.requests import ClientDisconnect, Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

from ctxd.client import DaemonUnavailable, RpcError
from ctxd.config import ProxyConfig
from ctxd.formats import Api
from ctxd.protocol.errors import ErrorCode
from ctxd.proxy import apis, wire
from ctxd.proxy.bodies import Bodies
from ctxd.proxy.convert import InvalidUnicode, dumps, loads
from ctxd.proxy.peers import refusal_body
from ctxd.proxy.screen import BodyTooLarge
from ctxd.proxy.sessions import Conversation, Refused, Sessions, Tracked, credential_of
from ctxd.proxy.windows import Managed, Windows

log = logging.getLogger("ctxd.proxy")

SESSION_HEADER = "x-ctxd-session"
WINDOW_HEADER = "x-ctxd-context-window"
REPLY_LIMIT_HEADER = "x-ctxd-reply-limit"
HOP_BY_HOP = frozenset({"host", "connection", "keep-alive", "proxy-authenticate", "proxy-authorization", "te",
                        "trailer", "trailers", "transfer-encoding", "upgrade", "content-length"})
CORS = frozenset({"access-control-allow-origin", "access-control-allow-credentials", "access-control-allow-methods",
                  "access-control-allow-headers", "access-control-expose-headers", "access-control-max-age"})
"""An upstream's CORS headers never reach the client: which pages may read the proxy's
answers is the proxy's to say (screen.py), not the upstream's (``*`` for its own API)."""
_FORWARD_DROP = frozenset(name.encode() for name in HOP_BY_HOP)
_FORWARD_JSON_DROP = _FORWARD_DROP | {b"accept-encoding", b"content-type"}
_FORWARD_JSON = [(b"accept-encoding", b"identity"), (b"content-type", b"application/json")]
_BACK = HOP_BY_HOP | CORS
_BACK_DECODED = _BACK | {"content-encoding"}
MAX_WINDOW = 2**31 - 1


class BadRequest(Exception):
    """A request the proxy cannot act on; the client gets a 400 with this message."""


def _bill_value(bill: dict[str, Any]) -> str:
    text = (f"uncached={bill.get('uncached', 0)}; cache-write={bill.get('cacheWrite', 0)}; "
            f"cache-read={bill.get('cacheRead', 0)}; billed={bill.get('billed', 0)}")
    usd = bill.get("usd")
    return text if usd is None else f"{text}; usd={usd}"


def bill_headers(session_id: str, prompt: dict[str, Any]) -> dict[str, str]:
    """The proxy's own response headers: the session, and what this request is expected to
    bill (input tokens as the provider counts them, ctxd's estimate: the reply's usage comes
    after the headers), through ctxd and had the client gone direct, and the session's totals
    so far; once the provider reported some of ctxd's requests, what it billed for them
    beside ctxd's estimate of the same requests (docs/proxy.md, "What it costs")."""
    out = {"x-ctxd-session": session_id}
    bill = prompt.get("bill")
    if isinstance(bill, dict):
        out["x-ctxd-bill"] = _bill_value(bill.get("ctxd") or {})
        out["x-ctxd-bill-direct"] = _bill_value(bill.get("direct") or {})
        billed, direct = bill.get("sessionBilled", 0), bill.get("sessionDirect", 0)
        ratio = f"; ratio={billed / direct:.4f}" if direct else ""
        out["x-ctxd-bill-session"] = (f"requests={bill.get('sessionRequests', 0)}; billed={billed}; "
                                      f"direct={direct}{ratio}")
        if bill.get("sessionMeasured"):
            out["x-ctxd-bill-reported"] = (f"requests={bill['sessionMeasured']}; "
                                           f"billed={bill.get('sessionReported', 0)}; "
                                           f"estimated={bill.get('sessionReportedEstimate', 0)}")
    return out


class ClientGone:
    """While the proxy waits for the upstream's answer, watches the client's connection and
    cancels the waiting task if the client hangs up: a whole answer (or a stream's head)
    awaited for a client that left would keep the upstream generating, and billing, until
    it ends or times out. Used once the request's body is read whole (the connection
    then has nothing to say but that it closed); a relayed stream is ended by Starlette,
    which watches the connection while it streams. The watch starts ``AFTER`` seconds in:
    an answer that comes sooner costs no task of its own."""

    AFTER = 0.05

    __slots__ = ("_task", "_timer", "_watch", "gone")

    def __init__(self, receive: Any) -> None:
        self._task = asyncio.current_task()
        self.gone = False
        self._watch: asyncio.Task[None] | None = None
        self._timer = asyncio.get_running_loop().call_later(self.AFTER, self._start, receive)

    def _start(self, receive: Any) -> None:
        self._watch = asyncio.get_running_loop().create_task(self._wait(receive))

    async def _wait(self, receive: Any) -> None:
        while (await receive())["type"] != "http.disconnect":
            pass
        self.gone = True
        if self._task is not None:
            self._task.cancel()

    def stop(self) -> None:
        self._timer.cancel()
        if self._watch is not None:
            self._watch.cancel()

    def consumed(self) -> bool:
        """Whether a cancellation of the task was this watch's (it is then taken back)."""
        if self.gone and self._task is not None and self._task.uncancel() == 0:
            return True
        return False


class Proxy:
    """``transport``: httpx's transport to the upstreams, used directly rather than through
    an ``httpx.AsyncClient``: a proxy has no base URL, default headers or cookies of its own
    to merge (the client's headers go as they are; a client's cookie jar would also carry
    one client's upstream cookies into another's requests), and the client's layers
    (merging, auth, redirects, cookies) were ~15% of the proxy's CPU per request."""

    def __init__(self, config: ProxyConfig, sessions: Sessions, transport: httpx.AsyncBaseTransport,
                 timeout: httpx.Timeout, windows: Windows | None = None) -> None:
        self.config = config
        self.windows = windows or Windows(config.context_window)
        self.sessions = sessions
        self.transport = transport
        self.timeout = timeout.as_dict()
        self._chat_urls: dict[tuple[Api, str], httpx.URL] = {}  # (the routes' few paths)
        self.bodies = Bodies()  # (the last bodies per conversation, decoded from what is new)

    # --- upstream addresses and headers ----------------------------------------------

    def upstream_url(self, api: Api, path: str) -> str:
        if api in ("openai", "responses"):
            base = self.config.openai_base_url.rstrip("/")
            tail = path[3:] if path.startswith("/v1/") or path == "/v1" else path
            return base + tail
        base = self.config.anthropic_base_url if api == "anthropic" else self.config.ollama_base_url
        return base.rstrip("/") + path

    def chat_url(self, api: Api, request: Request) -> httpx.URL:
        """:meth:`upstream_url` of a chat endpoint, parsed once (httpx parses a URL given as
        text on every request: about a third of building one), and looked up by the
        scope's path (``request.url`` builds a URL object to escape it)."""
        path = request.scope["path"]
        url = self._chat_urls.get((api, path))
        if url is None:
            url = self._chat_urls[(api, path)] = httpx.URL(self.upstream_url(api, request.url.path))
        return url

    def upstream_request(self, method: str, url: str | httpx.URL, *, headers: list[tuple[bytes, bytes]], content: Any,
                         query: bytes = b"") -> httpx.Request:
        """The request to the upstream: the URL, the client's query string as it came (a
        repeated parameter each time) and the headers as given (``Host`` and the body's
        length or chunking are httpx's), with the proxy's timeouts."""
        if query:
            url = httpx.URL(url).copy_with(query=query)
        return httpx.Request(method, url, headers=headers, content=content, extensions={"timeout": self.timeout})

    @staticmethod
    def forward_headers(request: Request, *, json_body: bool) -> list[tuple[bytes, bytes]]:
        """The client's headers as it sent them (a repeated one each time), but hop-by-hop
        and ``X-Ctxd-*`` ones; for a JSON body (one the proxy reads and may rewrite) its
        type, and ``identity`` asked of the answer (the proxy reads it). From the ASGI
        scope's raw list (lowercase names): Starlette's ``Headers`` decoded each anew."""
        drop = _FORWARD_JSON_DROP if json_body else _FORWARD_DROP
        out = [(k, v) for k, v in request.scope["headers"] if k not in drop and not k.startswith(b"x-ctxd-")]
        if json_body:
            out += _FORWARD_JSON
        return out

    @staticmethod
    def back_headers(response: httpx.Response, *, decoded: bool) -> dict[str, str]:
        drop = _BACK_DECODED if decoded else _BACK
        return {k: v for k, v in response.headers.items() if k.lower() not in drop}

    # --- the chat endpoints -----------------------------------------------------------

    async def chat(self, request: Request, api: Api) -> Response:
        raw = await request.body()
        read = self._read(request, api, raw)
        if read is None:
            return await self.passthrough(request, api, body=raw)
        body, parts, conv = read
        streaming = apis.is_streaming(api, body)
        whole: Literal["always", "unless-ok"] = "unless-ok" if streaming else "always"
        # A request whose prompt will be the client's own (Sessions.early) goes upstream
        # now, in the client's bytes; its turn (push and prompt) runs while the upstream
        # answers, and the answer waits for it (the messages are stored before it is).
        ahead: asyncio.Task[httpx.Response | Response] | None = None
        if self.sessions.early(conv, api, body):
            # The turn begins once the request has left: its CPU would otherwise run in
            # the gaps of the exchange's first steps, before the request is written.
            sent: asyncio.Future[None] = asyncio.get_running_loop().create_future()
            ahead = wire.sending(self._exchange(api, self._chat_request(request, api, raw), whole=whole,
                                                client=request), sent)
            try:
                await sent
            except BaseException:
                await _dropped(ahead)
                raise
        try:
            tracked, chain_then, prompt = await self.sessions.turn(conv, api)
        except BaseException as exc:
            # The client gets what it would have got had the request waited for its turn
            # (an error that says what ctxd could not do): its messages are not stored, so
            # the upstream's answer, asked already, is not handed on (docs/decisions.md).
            if ahead is not None:
                log.warning("a request sent upstream before its turn: the turn failed (%s), so the client "
                            "gets that error, not the upstream's answer", type(exc).__name__)
                await _dropped(ahead)
            if isinstance(exc, Refused):
                return JSONResponse(apis.error_body(api, exc.status, exc.message), status_code=exc.status)
            if isinstance(exc, RpcError):
                return self._ctxd_error(api, exc)
            if isinstance(exc, (DaemonUnavailable, OSError)):
                return JSONResponse(apis.error_body(api, 503, f"ctxd proxy: the ctxd daemon is unavailable: {exc}"),
                                    status_code=503)
            raise
        ours = bill_headers(tracked.id, prompt)
        if ahead is not None:
            # Sent as the client sent it: whether ctxd's prompt is the same is checked once
            # the answer went out, before its reply is pushed (``_check_ahead``).
            conv.ahead = (body, parts, prompt)
            started = time.perf_counter()
            response = await ahead
            self._log_chat(request, api, tracked, parts, prompt, apis.messages_of(api, body), response, streaming,
                           started, ahead=True)
            return self._answer_of(api, conv, tracked, chain_then, response, streaming, ours)
        out = apis.upstream_body(api, body, parts, prompt, conv.align, order_of(conv))
        conv.align.previous = None  # (what the next request builds on is conv.align.current)
        room = _limited_room(conv, prompt, body)
        if room is not None:
            # Prompt + max_tokens over the window is refused by the providers (Anthropic,
            # OpenAI): the reply gets what the window leaves, at least the reserve the
            # prompt was built beside (less when it was lent to the newest turn, never
            # below settings.outputFloor).
            apis.limit_reply(api, out, room)
            ours[REPLY_LIMIT_HEADER] = f"{max(1, room)}; asked={conv.output}"
            log.info("session %s: max_tokens %d -> %d (what the window leaves beside the prompt; reserved %s)",
                     tracked.id, conv.output, max(1, room), (prompt.get("budget") or {}).get("reservedOutput"))
        # A body ctxd left as the client sent it (nothing compressed, nothing added) goes
        # upstream in the client's own bytes, not encoded again.
        as_sent = room is None and apis.unchanged(api, body, out)
        self.sessions.verbatim(tracked, conv, api, prompt, as_sent=as_sent)
        started = time.perf_counter()
        upstream = self._chat_request(request, api, raw if as_sent else dumps(out))
        response = await self._exchange(api, upstream, whole=whole, client=request)
        self._log_chat(request, api, tracked, parts, prompt, out.get("input" if api == "responses" else "messages"),
                       response, streaming, started)
        return self._answer_of(api, conv, tracked, chain_then, response, streaming, ours)

    @staticmethod
    def _log_chat(request: Request, api: Api, tracked: Tracked, parts: Any, prompt: dict[str, Any], sent: Any,
                  response: httpx.Response | Response, streaming: bool, started: float, *,
                  ahead: bool = False) -> None:
        """One line per proxied request (-v): which session, what the client sent, what went
        upstream, and the upstream's answer (its figures made only when it is written)."""
        if log.isEnabledFor(logging.INFO):
            log.info("%s %s: session %s, %d messages from the client, %d sent (%s tokens): %s %d in %.2f s%s%s",
                     request.method, request.url.path, tracked.id, len(parts.conversation), len(sent or []),
                     f"{prompt.get('tokens', 0):,}", "upstream" if not isinstance(response, Response) else "answered",
                     response.status_code, time.perf_counter() - started, ", streamed" if streaming else "",
                     ", sent before its turn" if ahead else "")

    def _check_ahead(self, conv: Conversation, tracked: Tracked, chain_then: list[str]) -> None:
        """A request sent ahead of its turn, its answer out: whether ctxd's prompt was the
        client's (``Sessions.verbatim``, which the session's next request builds on). Not
        expected otherwise (``appendRoom`` bounds what the request appended); then it went
        as the client would have sent it direct, within the window, and ctxd's figures,
        of another prompt, are not paired with the reply's usage. Checked here, not before
        the answer: the upstream body's alignment cost the answer ~0.1 ms each time for a
        case that does not happen (its headers carry ctxd's figures of the turn). A session
        another request took a turn of since (``chain_then`` is no longer its chain) holds
        that request's state, which is left as it is (this reply is not pushed either)."""
        checked, conv.ahead = conv.ahead, None
        if checked is None:
            return
        if tracked.chain != chain_then:
            conv.align.previous = None
            return
        body, parts, prompt = checked
        api = conv.api
        out = apis.upstream_body(api, body, parts, prompt, conv.align, order_of(conv))
        conv.align.previous = None
        as_sent = _limited_room(conv, prompt, body) is None and apis.unchanged(api, body, out)
        self.sessions.verbatim(tracked, conv, api, prompt, as_sent=as_sent)
        if not as_sent:
            conv.prompt_tokens = None
            log.warning("session %s: the request went upstream before its turn as the client sent it, "
                        "but ctxd's prompt for it is not the client's (%s tokens)", tracked.id,
                        f"{prompt.get('tokens', 0):,}")

    async def _checked(self, conv: Conversation, tracked: Tracked, chain_then: list[str]) -> None:
        """:meth:`_check_ahead` as a background task: on the loop, once the answer is out."""
        self._check_ahead(conv, tracked, chain_then)

    def _answer_of(self, api: Api, conv: Conversation, tracked: Tracked, chain_then: list[str],
                   response: httpx.Response | Response, streaming: bool, ours: dict[str, str]) -> Response:
        if isinstance(response, Response):
            return response
        if not streaming or response.status_code != 200:
            # The reply is pushed once the answer is handed to uvicorn (Starlette runs the
            # task right after the body's send): the answer's joined write (wire.py) goes
            # out first, then the reply is read and its push sent (``_push_whole``). The
            # session's next request finds the push registered (it cannot come before
            # the answer).
            push: BackgroundTask | None = None
            if response.status_code == 200:
                push = BackgroundTask(self._push_whole, api, conv, tracked, chain_then, response)
            elif conv.ahead is not None:
                # (An error answered to a request sent ahead: only the check, which its
                # session's next request builds on, a retry after a 429 say.)
                push = BackgroundTask(self._checked, conv, tracked, chain_then)
            return Response(response.content, status_code=response.status_code,
                            headers={**self.back_headers(response, decoded=True), **ours}, background=push)
        return StreamingResponse(self._relay(api, conv, tracked, chain_then, response),
                                 status_code=response.status_code,
                                 headers={**self.back_headers(response, decoded=True), **ours})

    def _chat_request(self, request: Request, api: Api, content: bytes) -> httpx.Request:
        return self.upstream_request("POST", self.chat_url(api, request),
                                     headers=self.forward_headers(request, json_body=True),
                                     query=request.scope["query_string"], content=content)

    def _read(self, request: Request, api: Api, raw: bytes) -> tuple[dict[str, Any], Any, Conversation] | None:
        """The request's body, its parts and the conversation it belongs to; None for a body
        that is not a chat (it passes through as it is)."""
        session = request.headers.get(SESSION_HEADER) or None
        credential = credential_of(request.headers)
        try:
            body = self.bodies.loads(api, (session, credential), raw)
        except InvalidUnicode as exc:
            raise BadRequest(f"ctxd proxy: the request body is not valid: {exc}") from None
        except ValueError:
            return None
        except RecursionError:
            raise BadRequest("ctxd proxy: the request body is nested too deeply to read") from None
        if not isinstance(body, dict) or apis.messages_of(api, body) is None:
            if isinstance(body, dict) and api == "responses" and body.get("previous_response_id"):
                log.info("a Responses API request continuing a stored response (previous_response_id) "
                         "passes through unchanged: its history is on the upstream's side")
            return None
        output = apis.reply_limit(api, body)
        managed = self._window(api, request, body, raw, output)
        if managed is None:
            log.info("model %r has no entry in proxy.context_window and its request fits its own window: "
                     "passed through unchanged", body.get("model"))
            return None
        parts = apis.split(api, body)
        conv = self.sessions.read(api, body, parts, session=session,
                                  window=managed.window, output=output, credential=credential,
                                  user_agent=request.headers.get("user-agent"))
        return body, parts, conv

    def _window(self, api: Api, request: Request, body: dict[str, Any], raw: bytes,
                output: int | None) -> Managed | None:
        """The request's window (None: ctxd's rule for the model), first that answers:
        ``X-Ctxd-Context-Window``, Ollama ``options.num_ctx``, ``proxy.context_window``
        (windows.py); None: a model that table leaves out, passed through. A header or
        ``num_ctx`` that is no window (not a whole number of tokens from 1 to 2^31-1) is
        a 400 naming it."""
        header = request.headers.get(WINDOW_HEADER)
        if header is not None and header.strip():
            text = header.strip()
            if not (text.isdigit() and len(text) <= 10 and 0 < int(text) <= MAX_WINDOW):
                raise BadRequest(f"ctxd proxy: X-Ctxd-Context-Window: {text[:40]!r}"
                                 f"{'...' if len(text) > 40 else ''} is not a window (a whole number of tokens "
                                 f"from 1 to {MAX_WINDOW})")
            return Managed(int(text))
        if api == "ollama":
            num_ctx = (body.get("options") or {}).get("num_ctx") if isinstance(body.get("options"), dict) else None
            if num_ctx is not None:
                if isinstance(num_ctx, float) and num_ctx.is_integer() and 0 < num_ctx <= MAX_WINDOW:
                    num_ctx = int(num_ctx)
                if isinstance(num_ctx, bool) or not isinstance(num_ctx, int) or not 0 < num_ctx <= MAX_WINDOW:
                    raise BadRequest(f"ctxd proxy: options.num_ctx: {str(num_ctx)[:40]} is not a window (a whole "
                                     f"number of tokens from 1 to {MAX_WINDOW})")
                return Managed(num_ctx)
        model = body.get("model")
        return self.windows.decide(model if isinstance(model, str) else None, raw, output)

    async def _push_whole(self, api: Api, conv: Conversation, tracked: Tracked, chain_then: list[str],
                          response: httpx.Response) -> None:
        """The reply of a whole answer, pushed after the answer went out: the answer's
        write (``wire.CoalescingTransport``, queued on the loop by uvicorn's send) runs
        before reading the reply, which is not the client's to wait for. Both run in the
        same turn of the loop, before any connection is read again: the session's next
        request finds the push registered."""
        await asyncio.sleep(0)
        try:
            reply = apis.reply_of(api, loads(response.content))
        except ValueError:
            log.warning("session %s: the upstream's answer is not JSON; nothing pushed", tracked.id)
            return
        await self._push_reply(conv, tracked, chain_then, reply)

    async def _push_reply(self, conv: Conversation, tracked: Tracked, chain_then: list[str],
                          reply: apis.Reply) -> None:
        self._check_ahead(conv, tracked, chain_then)
        if reply.error or not reply.complete or not reply.messages:
            log.warning("session %s: the reply is not pushed (%s)", tracked.id, reply.error or "incomplete")
            return
        # Sent, not waited for: should it fail, the client sends the reply back with its
        # next request, which pushes it then (without usage).
        await self.sessions.push_reply(tracked, chain_then, conv, reply.messages, reply.usage)

    async def _relay(self, api: Api, conv: Conversation, tracked: Tracked, chain_then: list[str],
                     response: httpx.Response) -> AsyncIterator[bytes]:
        """Each upstream chunk goes to the client as it arrives; the reply is assembled on
        the way and pushed once the stream ended whole. The push is sent before the chunk
        that completes the reply (``[DONE]``, ``message_stop``, ``done: true``,
        ``response.completed``) is relayed, and the session's next request waits for its
        answer: a client that sends its next request as soon as the stream ends finds the
        reply stored with its usage (else that request would push the client's copy,
        without usage). A client that hangs up cancels this generator, which closes the
        upstream request."""
        assembler = apis.Assembler(api)
        pushed = False
        try:
            try:
                async for chunk in response.aiter_bytes():
                    assembler.feed(chunk)
                    if not pushed and assembler.reply.complete and not assembler.reply.error:
                        pushed = True
                        await self._push_reply(conv, tracked, chain_then, assembler.finish())
                    yield chunk
            except httpx.TimeoutException:
                log.warning("session %s: the upstream stream stalled; ended with an error event", tracked.id)
                yield apis.stream_error(api, "ctxd proxy: the upstream stopped sending (timeout)")
                return
            except httpx.HTTPError as exc:
                log.warning("session %s: the upstream stream broke: %s", tracked.id, type(exc).__name__)
                yield apis.stream_error(api, f"ctxd proxy: the upstream stream broke: {type(exc).__name__}")
                return
            reply = assembler.finish()
            if not reply.complete and not reply.error:
                log.warning("session %s: the upstream stream ended before its end", tracked.id)
                yield apis.stream_error(api, "ctxd proxy: the upstream stream ended before its end")
                return
            if not pushed:
                await self._push_reply(conv, tracked, chain_then, reply)
        finally:
            await response.aclose()

    async def _exchange(self, api: Api, upstream: httpx.Request, *, whole: Literal["always", "unless-ok", "never"],
                        replayable: bool = True, client: Request | None = None) -> httpx.Response | Response:
        """The upstream's answer, its body read (``whole``: always, unless it is a 200 to
        relay as a stream, never), or the error the client gets instead: 504 for a
        timeout, 502 for anything else. ``client``: the request, read whole, whose
        connection is watched meanwhile: should the client hang up, the upstream request
        is cancelled (its connection closed) and a 499 returned, which nobody reads."""
        if client is None:
            return await self._answer(api, upstream, whole=whole, replayable=replayable)
        watch = ClientGone(client.receive)
        try:
            return await self._answer(api, upstream, whole=whole, replayable=replayable)
        except asyncio.CancelledError:
            if not watch.consumed():
                raise
            log.info("the client hung up before the upstream answered; the upstream request was cancelled")
            return Response(status_code=499)
        finally:
            watch.stop()

    async def _answer(self, api: Api, upstream: httpx.Request, *, whole: Literal["always", "unless-ok", "never"],
                      replayable: bool) -> httpx.Response | Response:
        try:
            response = await self._send(upstream, replayable=replayable)
        except httpx.TimeoutException as exc:
            return self._upstream_error(api, 504, f"the upstream did not answer in time ({type(exc).__name__})")
        except httpx.HTTPError as exc:
            return self._upstream_error(api, 502, f"the upstream could not be reached: {type(exc).__name__}: {exc}")
        if whole == "always" or (whole == "unless-ok" and response.status_code != 200):
            try:
                await response.aread()
            except httpx.TimeoutException as exc:
                return self._upstream_error(api, 504, f"the upstream stopped sending its answer ({type(exc).__name__})")
            except httpx.HTTPError as exc:
                return self._upstream_error(api, 502, f"the upstream's answer was cut: {type(exc).__name__}: {exc}")
            finally:
                await response.aclose()
        return response

    async def _send(self, upstream: httpx.Request, *, replayable: bool = True) -> httpx.Response:
        """The upstream's answer, returned once its headers are in (the body is read or
        relayed by the caller).

        A pooled keep-alive connection that the upstream closes just as it is reused (its
        idle timeout and httpx's pool racing: seen as a 502 under load) fails before any
        answer: "Server disconnected without sending a response", a reset, a broken pipe.
        The upstream did not take the request, so it is sent once more, on a new
        connection, when its body can be sent again. So is a refused connection. Nothing
        is sent again once an answer began, nor after a timeout."""
        try:
            response = await self.transport.handle_async_request(upstream)
        except (httpx.ConnectError, httpx.ReadError, httpx.WriteError, httpx.RemoteProtocolError) as exc:
            if not replayable or (isinstance(exc, httpx.RemoteProtocolError)
                                  and "without sending a response" not in str(exc)):
                raise
            log.info("the upstream closed a connection before answering (%s); sending the request again",
                     type(exc).__name__)
            response = await self.transport.handle_async_request(upstream)
        response.request = upstream
        return response

    def _ctxd_error(self, api: Api, exc: RpcError) -> Response:
        if exc.code == ErrorCode.ContextOverflow:
            # What the providers answer for a prompt too long: agents compact on it.
            return JSONResponse(apis.error_body(api, 400, f"prompt is too long: {exc.message}"), status_code=400)
        if exc.code == ErrorCode.InvalidParams:
            # Something of the request ctxd cannot take (a field too long...): the client's to fix.
            log.info("ctxd refused the request: %s", exc)
            return JSONResponse(apis.error_body(api, 400, f"ctxd proxy: ctxd refused the request: {exc}"),
                                status_code=400)
        log.warning("ctxd refused: %s", exc)
        return JSONResponse(apis.error_body(api, 500, f"ctxd proxy: ctxd refused the request: {exc}"),
                            status_code=500)

    @staticmethod
    def _upstream_error(api: Api, status: int, message: str) -> Response:
        log.warning("%s", message)
        return JSONResponse(apis.error_body(api, status, f"ctxd proxy: {message}"), status_code=status)

    # --- count_tokens -----------------------------------------------------------------

    async def count_tokens(self, request: Request) -> Response:
        """Counts what ``/v1/messages`` would send now: ctxd's prompt for the session plus
        the client's messages it does not hold yet (nothing is pushed or created)."""
        api: Api = "anthropic"
        raw = await request.body()
        read = self._read(request, api, raw)
        if read is None:
            return await self.passthrough(request, api, body=raw)
        body, parts, conv = read
        out = body
        try:
            tracked, plan = await self.sessions.peek(conv)
            if tracked is not None and plan is not None:
                prompt = await self.sessions.prompt(tracked, api)
                new_raw = [conv.items[j][2] for j in plan.new]
                prompt = dict(prompt, messages=list(prompt["messages"]) + new_raw)
                out = apis.upstream_body(api, body, parts, prompt)
        except Refused as exc:
            return JSONResponse(apis.error_body(api, exc.status, exc.message), status_code=exc.status)
        except RpcError as exc:
            return self._ctxd_error(api, exc)
        except (DaemonUnavailable, OSError) as exc:
            return JSONResponse(apis.error_body(api, 503, f"ctxd proxy: the ctxd daemon is unavailable: {exc}"),
                                status_code=503)
        upstream = self.upstream_request("POST", self.upstream_url(api, request.url.path), content=dumps(out),
                                         headers=self.forward_headers(request, json_body=True),
                                         query=request.scope["query_string"])
        response = await self._exchange(api, upstream, whole="always", client=request)
        if isinstance(response, Response):
            return response
        return Response(response.content, status_code=response.status_code,
                        headers=self.back_headers(response, decoded=True))

    # --- everything else ----------------------------------------------------------------

    def api_of(self, request: Request) -> Api:
        path = request.url.path
        if path.startswith("/api/"):
            return "ollama"
        if "anthropic-version" in request.headers or "x-api-key" in request.headers:
            return "anthropic"
        return "openai"

    async def passthrough(self, request: Request, api: Api | None = None, *, body: bytes | None = None) -> Response:
        """Forward unchanged, both ways, streaming (``/v1/models``, ``/api/tags``, ``/api/show``...)."""
        api = api or self.api_of(request)
        if body is None and "content-length" not in request.headers and "transfer-encoding" not in request.headers:
            body = b""  # no body (GET...): the request can be sent again
        content: Any = body if body is not None else request.stream()
        upstream = self.upstream_request(request.method, self.upstream_url(api, request.url.path),
                                         headers=self.forward_headers(request, json_body=False),
                                         query=request.scope["query_string"], content=content)
        started = time.perf_counter()
        response = await self._exchange(api, upstream, whole="never", replayable=body is not None,
                                        client=request if body is not None else None)
        log.info("%s %s: passed through: %s %d in %.2f s", request.method, request.url.path,
                 "upstream" if not isinstance(response, Response) else "answered", response.status_code,
                 time.perf_counter() - started)
        if isinstance(response, Response):
            return response

        async def relay() -> AsyncIterator[bytes]:
            try:
                async for chunk in response.aiter_raw():
                    yield chunk
            except httpx.HTTPError as exc:
                log.warning("pass-through of %s broke: %s", request.url.path, type(exc).__name__)
            finally:
                await response.aclose()

        return StreamingResponse(relay(), status_code=response.status_code,
                                 headers=self.back_headers(response, decoded=False))


async def _dropped(ahead: asyncio.Task[httpx.Response | Response]) -> None:
    """A request sent ahead whose answer the client will not get: cancelled if it has not
    come yet (its connection closed), else closed."""
    if not ahead.done():
        ahead.cancel()
    try:
        response = await ahead
    except (asyncio.CancelledError, Exception):
        return
    if isinstance(response, httpx.Response):
        await response.aclose()


def _limited_room(conv: Conversation, prompt: dict[str, Any], body: dict[str, Any]) -> int | None:
    """What the window leaves the reply beside ctxd's prompt, when it is less than the
    request asked for (``max_tokens`` then lowered to it); None otherwise."""
    if conv.output is None:
        return None
    room = apis.reply_room(prompt, body)
    return room if room is not None and room < conv.output else None


def order_of(conv: Conversation) -> apis.Order | None:
    """What the alignment needs of the request's plan (identity.py), per client message."""
    if conv.plan is None:
        return None
    if conv.counts and conv.counts[-1] == len(conv.parts.conversation):  # (each client message is an item: the rule)
        return apis.Order(conv.api, list(conv.idents), list(conv.shapes), conv.plan.extends, list(conv.anchors))
    idents: list[Any] = []
    shapes: list[str | None] = []
    anchors: list[bool] = []
    counts = conv.counts
    for i in range(len(conv.parts.conversation)):
        if counts[i + 1] > counts[i]:
            idents.append(conv.idents[counts[i]])
            shapes.append(conv.shapes[counts[i]])
            anchors.append(conv.anchors[counts[i]])
        else:
            idents.append(None)
            shapes.append(None)
            anchors.append(False)
    return apis.Order(conv.api, idents, shapes, conv.plan.extends, anchors)


def build_app(proxy: Proxy) -> Starlette:
    async def openai(request: Request) -> Response:
        return await proxy.chat(request, "openai")

    async def anthropic(request: Request) -> Response:
        return await proxy.chat(request, "anthropic")

    async def ollama(request: Request) -> Response:
        return await proxy.chat(request, "ollama")

    async def responses(request: Request) -> Response:
        return await proxy.chat(request, "responses")

    async def count(request: Request) -> Response:
        return await proxy.count_tokens(request)

    async def other(request: Request) -> Response:
        return await proxy.passthrough(request)

    methods = ["GET", "POST", "PUT", "PATCH", "DELETE", "HEAD", "OPTIONS"]
    return Starlette(exception_handlers={BadRequest: _bad_request, RecursionError: _too_deep,
                                         BodyTooLarge: _too_large, ClientDisconnect: _client_gone}, routes=[
        Route("/v1/chat/completions", openai, methods=["POST"]),
        Route("/chat/completions", openai, methods=["POST"]),
        Route("/v1/messages", anthropic, methods=["POST"]),
        Route("/v1/messages/count_tokens", count, methods=["POST"]),
        Route("/api/chat", ollama, methods=["POST"]),
        Route("/v1/responses", responses, methods=["POST"]),
        Route("/responses", responses, methods=["POST"]),
        Route("/{path:path}", other, methods=methods),
    ])


# --- what the client sent wrong, in one line (never a traceback) ------------------------


def _error(request: Request, status: int, message: str) -> Response:
    """An error in the shape of the API the request was for."""
    return Response(refusal_body(request.url.path, {k for k, _ in request.headers.raw}, message, status),
                    status_code=status, media_type="application/json")


async def _bad_request(request: Request, exc: Exception) -> Response:
    log.info("a bad request for %s: %s", request.url.path, exc)
    return _error(request, 400, str(exc))


async def _too_deep(request: Request, exc: Exception) -> Response:
    log.info("a request for %s nested too deeply to handle", request.url.path)
    return _error(request, 400, "ctxd proxy: the request is nested too deeply to handle")


async def _too_large(request: Request, exc: Exception) -> Response:
    """The body passed ``proxy.max_body_bytes`` as it was read: 413 (the rest of the body
    is skipped as it comes, never buffered)."""
    log.warning("refused a request body larger than %s bytes (proxy.max_body_bytes)",
                f"{exc.limit:,}" if isinstance(exc, BodyTooLarge) else "?")
    return _error(request, 413, f"ctxd proxy: {exc}")


async def _client_gone(request: Request, exc: Exception) -> Response:
    """The client hung up before its request's body was whole: nothing was done; the
    answer goes nowhere."""
    log.info("the client hung up while sending its request for %s; nothing was done", request.url.path)
    return Response(status_code=499)
