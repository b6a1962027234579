"""A web page in the owner's browser cannot use the proxy (issue 23, 3).

A page's requests come from the owner's uid, so the kernel's check lets them through; what
gives them away is what a browser always sends: the page's ``Host`` (DNS rebinding: a name
of the attacker's that resolves to 127.0.0.1) and ``Origin`` (a cross-origin request, a
"simple" POST with ``Content-Type: text/plain`` sent without a preflight). Each is refused
before anything is pushed or forwarded; preflights are answered by the proxy, never by the
upstream (whose ``access-control-allow-origin: *`` would open it to every page). The
requests are made as a browser makes them: raw headers over httpx."""

from __future__ import annotations

import json

import httpx
import pytest

from tests.proxy.conftest import both_modes, sessions
from tests.proxy.upstream import MODEL

CHAT = {"model": MODEL, "messages": [{"role": "user", "content": "delete my sessions"}]}


@both_modes
async def test_a_dns_rebinding_page_is_refused(proxy, upstream, ctxd_daemon) -> None:
    port = proxy.url.rsplit(":", 1)[1]
    async with httpx.AsyncClient(base_url=proxy.url, timeout=30) as client:
        for host in (f"evil.example:{port}", "evil.example", f"127.0.0.1.evil.example:{port}"):
            answer = await client.post("/v1/chat/completions", json=CHAT, headers={"host": host})
            assert answer.status_code == 403, answer.text
            error = answer.json()["error"]
            assert error["type"] == "permission_error" and "is not a loopback name" in error["message"]
        assert upstream.received == [] and await sessions(ctxd_daemon) == []
        # The loopback names are served, port or not.
        for host in (f"127.0.0.1:{port}", f"localhost:{port}", "localhost", f"127.1.2.3:{port}"):
            answer = await client.post("/v1/chat/completions", json=CHAT, headers={"host": host})
            assert answer.status_code == 200, (host, answer.text)
    assert len(upstream.chats()) == 4
    assert "refused a request for Host 'evil.example" in proxy.log()


async def test_a_name_of_the_users_own_is_served_when_configured(start_proxy, upstream) -> None:
    proxy = start_proxy("--set", 'proxy.allowed_hosts=["devbox.lan"]')
    async with httpx.AsyncClient(base_url=proxy.url, timeout=30) as client:
        allowed = await client.post("/v1/chat/completions", json=CHAT, headers={"host": "DevBox.lan:1"})
        assert allowed.status_code == 200
        assert (await client.post("/v1/chat/completions", json=CHAT, headers={"host": "other.lan"})).status_code == 403


@both_modes
async def test_a_cross_origin_page_is_refused_and_preflights_never_reach_the_upstream(proxy, upstream,
                                                                                      ctxd_daemon) -> None:
    page = {"origin": "http://evil.example"}
    async with httpx.AsyncClient(base_url=proxy.url, timeout=30) as client:
        # A "simple" request: no preflight, text/plain, the page's Origin.
        simple = await client.post("/v1/chat/completions", content=json.dumps(CHAT).encode(),
                                   headers={**page, "content-type": "text/plain"})
        assert simple.status_code == 403 and "requests from web pages are refused" in simple.json()["error"]["message"]
        assert "access-control-allow-origin" not in simple.headers
        # Anthropic's shape for an Anthropic request.
        anthropic = await client.post("/v1/messages", json={**CHAT, "max_tokens": 10},
                                      headers={**page, "anthropic-version": "2023-06-01", "x-api-key": "k"})
        assert anthropic.status_code == 403 and anthropic.json()["error"]["type"] == "permission_error"
        # A page on a loopback address is a page too (any local user can serve one).
        local = await client.post("/v1/chat/completions", json=CHAT, headers={"origin": "http://localhost:3000"})
        assert local.status_code == 403
        # A preflight is answered by the proxy: refused, and never forwarded.
        preflight = await client.options("/v1/messages", headers={
            **page, "access-control-request-method": "POST",
            "access-control-request-headers": "content-type,x-api-key"})
        assert preflight.status_code == 403
        assert "access-control-allow-origin" not in preflight.headers
        passthrough = await client.get("/v1/models", headers=page)
        assert passthrough.status_code == 403
    assert upstream.received == []
    assert await sessions(ctxd_daemon) == []


async def test_an_allowed_origin_is_served_with_cors_headers_from_the_proxy(start_proxy, upstream) -> None:
    proxy = start_proxy("--set", 'proxy.allowed_origins=["http://localhost:3000"]')
    page = {"origin": "http://localhost:3000"}
    async with httpx.AsyncClient(base_url=proxy.url, timeout=30) as client:
        preflight = await client.options("/v1/chat/completions", headers={
            **page, "access-control-request-method": "POST", "access-control-request-headers": "content-type"})
        assert preflight.status_code == 204
        assert preflight.headers["access-control-allow-origin"] == "http://localhost:3000"
        assert preflight.headers["access-control-allow-headers"] == "content-type"
        assert "POST" in preflight.headers["access-control-allow-methods"]
        answer = await client.post("/v1/chat/completions", json=CHAT, headers=page)
        assert answer.status_code == 200 and answer.headers["access-control-allow-origin"] == "http://localhost:3000"
        other = await client.post("/v1/chat/completions", json=CHAT, headers={"origin": "http://localhost:4000"})
        assert other.status_code == 403
    assert [r.path for r in upstream.received] == ["/v1/chat/completions"]  # the preflight was not forwarded


async def test_the_upstreams_cors_headers_never_reach_the_client(proxy, upstream) -> None:
    async with httpx.AsyncClient(base_url=proxy.url, timeout=30) as client:
        models = await client.get("/v1/models")
        missing = await client.get("/v1/nothing-here")
    assert models.status_code == 200 and models.headers["x-upstream"] == "fake"
    assert missing.status_code == 404
    for answer in (models, missing):
        assert "access-control-allow-origin" not in answer.headers


async def test_the_chat_routes_take_only_json(proxy, upstream, ctxd_daemon) -> None:
    async with httpx.AsyncClient(base_url=proxy.url, timeout=30) as client:
        for ctype in ("text/plain", "application/x-www-form-urlencoded", "multipart/form-data; boundary=x"):
            answer = await client.post("/v1/chat/completions", content=json.dumps(CHAT).encode(),
                                       headers={"content-type": ctype})
            assert answer.status_code == 415, answer.text
            assert "takes a JSON body" in answer.json()["error"]["message"]
        for ctype in ("application/json", "application/json; charset=utf-8", "application/vnd.api+json"):
            answer = await client.post("/v1/chat/completions", content=json.dumps(CHAT).encode(),
                                       headers={"content-type": ctype})
            assert answer.status_code == 200, (ctype, answer.text)
    assert len(upstream.chats()) == 3


@pytest.mark.parametrize("proxy_mode", ["in-process"], indirect=True)
async def test_web_pages_cannot_make_retention_delete_the_users_sessions(start_proxy, upstream, ctxd_daemon) -> None:
    """With ``sessions.max_sessions = 3``, three requests of a page each creating a session
    made retention delete the user's three: now none is created."""
    proxy = start_proxy("--set", "sessions.max_sessions=3")
    port = proxy.url.rsplit(":", 1)[1]
    async with httpx.AsyncClient(base_url=proxy.url, timeout=30) as client:
        for name in ("mine1", "mine2", "mine3"):
            assert (await client.post("/v1/chat/completions", json=CHAT, headers={"x-ctxd-session": name})
                    ).status_code == 200
        for i, headers in enumerate([{"host": f"evil.example:{port}"},
                                     {"origin": "http://evil.example", "content-type": "text/plain"},
                                     {"origin": "null"}]):
            page = await client.post("/v1/chat/completions", content=json.dumps(CHAT).encode(),
                                     headers={"content-type": "application/json", "x-ctxd-session": f"page{i}",
                                              **headers})
            assert page.status_code == 403
    assert sorted(s["sessionId"] for s in await sessions(ctxd_daemon)) == ["mine1", "mine2", "mine3"]
