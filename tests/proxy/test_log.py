"""What ``ctxd proxy -v`` says: one line per proxied request (the session, what the client
sent, what went upstream, the upstream's answer), nothing at WARNING on a normal start,
and no "request N failed: session ... does not exist" for the lookups the proxy makes to
find a conversation's session (an answer, not a failure), neither in the proxy's log nor
in the log of a daemon it talks to over the socket (``-v`` too)."""

from __future__ import annotations

from pathlib import Path

import openai

from tests.e2e.helpers import Daemon, storage_args
from tests.proxy.conftest import ProxyProcess, both_modes
from tests.proxy.upstream import MODEL, FakeUpstream


@both_modes
async def test_the_verbose_log_has_a_line_per_request_and_no_noise(upstream: FakeUpstream, ctxd_daemon: Daemon,
                                                                  base_dir: Path, proxy_mode: str) -> None:
    assert ctxd_daemon.socket_path is not None
    daemon = None
    if proxy_mode == "socket":  # the same daemon, verbose as a user running it with -v would
        ctxd_daemon.stop()
        daemon = Daemon(ctxd_daemon.data_dir, socket_path=ctxd_daemon.socket_path, args=["-v"]).start()
    own = ["--data-dir", str(ctxd_daemon.data_dir), *storage_args(ctxd_daemon.data_dir)] \
        if proxy_mode == "in-process" else []
    proxy = ProxyProcess(ctxd_daemon.socket_path, upstream, base_dir / "verbose.log", own)
    proxy.command = ["-v" if arg == "-vv" else arg for arg in proxy.command
                     if not (proxy_mode == "in-process" and arg == "--no-autostart")]
    proxy.start()
    try:
        client = openai.AsyncOpenAI(base_url=proxy.url + "/v1", api_key="sk-x", max_retries=0)
        messages = [{"role": "user", "content": "first question"}]
        for turn in range(3):
            reply = await client.chat.completions.create(model=MODEL, messages=messages)
            messages += [{"role": "assistant", "content": reply.choices[0].message.content},
                         {"role": "user", "content": f"question {turn + 2}"}]
        await client.models.list()
    finally:
        proxy.stop()
        if daemon is not None:
            daemon.stop()
    log = proxy.log()
    lines = [line for line in log.splitlines() if "POST /v1/chat/completions:" in line]
    assert len(lines) == 3, log
    assert all("session proxy-openai-" in line and "upstream 200" in line for line in lines), lines
    assert [line.split(", ")[1] for line in lines] == [f"{n} messages from the client" for n in (1, 3, 5)]
    assert sum("GET /v1/models: passed through" in line for line in log.splitlines()) == 1, log
    assert " WARNING " not in log and "does not exist" not in log, log
    if daemon is not None:
        assert "does not exist" not in daemon.stderr_text(), daemon.stderr_text()
