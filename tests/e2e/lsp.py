"""pytest-lsp plumbing for ctxd: a LanguageClient whose params and results stay plain
dicts, and small request helpers. Fixtures using these live in conftest.py."""

from __future__ import annotations

import asyncio
import concurrent.futures
import json
from typing import Any

import pytest
from lsprotocol import types
from pygls.exceptions import JsonRpcException
from pygls.protocol import JsonRPCNotification, JsonRPCRequestMessage, JsonRPCResponseMessage, default_converter
from pytest_lsp import LanguageClient
from pytest_lsp.protocol import LanguageClientProtocol


def _keep_dicts(obj: dict[str, Any], cls: type) -> Any:
    return cls(**obj)


def dict_converter() -> Any:
    """pygls' converter, except that params and results of ctxd's own methods stay
    plain dicts (pygls' default turns them into namedtuples)."""
    converter = default_converter()
    for cls in (JsonRPCRequestMessage, JsonRPCResponseMessage, JsonRPCNotification):
        converter.register_structure_hook(cls, _keep_dicts)
    return converter


class CtxdClientProtocol(LanguageClientProtocol):
    """ctxd is not a language server: ``initialize`` and friends carry ctxd's shapes
    (e.g. ``capabilities.methods``), so no message is structured as an lsprotocol type."""

    def get_message_type(self, method: str) -> Any:
        return None

    def get_result_type(self, method: str) -> Any:
        return None


def make_client() -> LanguageClient:
    """The ``client_factory`` of every ClientServerConfig in this suite."""
    client = LanguageClient(protocol_cls=CtxdClientProtocol, converter_factory=dict_converter)
    # pytest-lsp's capability checks refuse to run before initialize_session() set these;
    # ctxd's tests send initialize themselves (sometimes deliberately late).
    client.capabilities = types.ClientCapabilities()
    return client


async def request(client: LanguageClient, method: str, params: Any = None, timeout: float = 60) -> Any:
    return await asyncio.wait_for(client.protocol.send_request_async(method, params), timeout)


async def initialize(client: LanguageClient, **params: Any) -> Any:
    result = await request(client, "initialize", {"processId": None, "clientInfo": {"name": "e2e"}, **params})
    client.protocol.notify("initialized", {})
    return result


async def rpc_error(client: LanguageClient, method: str, params: Any = None) -> JsonRpcException:
    with pytest.raises(JsonRpcException) as info:
        await request(client, method, params)
    return info.value


async def raw_request(client: LanguageClient, message: dict[str, Any], timeout: float = 60) -> Any:
    """Send ``message`` exactly as given (e.g. without a ``params`` field, which pygls
    would always add) and await its response through pygls' bookkeeping."""
    future: concurrent.futures.Future[Any] = concurrent.futures.Future()
    client.protocol._request_futures[message["id"]] = future
    body = json.dumps(message).encode()
    client.protocol.writer.write(b"Content-Length: %d\r\n\r\n%b" % (len(body), body))
    return await asyncio.wait_for(asyncio.wrap_future(future), timeout)


async def create(client: LanguageClient, **params: Any) -> dict[str, Any]:
    return await request(client, "session/create", params)


async def push(client: LanguageClient, session_id: str, messages: list[dict[str, Any]]) -> dict[str, Any]:
    return await request(client, "session/push", {"sessionId": session_id, "messages": messages})


async def finish_client(client: LanguageClient) -> None:
    """Shut the server down politely if it still runs, else kill it; never hang."""
    server = client._server
    if server is not None and server.returncode is None:
        try:
            await asyncio.wait_for(client.protocol.send_request_async("shutdown", None), 10)
            client.protocol.notify("exit", None)
            await asyncio.wait_for(server.wait(), 10)
        except Exception:
            pass
        if server.returncode is None:
            server.kill()
            await server.wait()
    await asyncio.wait_for(client.stop(), 30)
