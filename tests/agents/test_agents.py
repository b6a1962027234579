"""The real agent CLIs (Claude Code, Codex CLI, opencode, aider) as clients of ``ctxd proxy``.

Each CLI does the short form of the task (tests/agents/script.py: read, run the tests,
edit one file, run them again; ~10 requests) twice, offline in a private network
namespace: direct to the scripted upstream, and through ``ctxd proxy`` at a window below
the conversation. What holds on main is asserted; what issue 21 asks and main does not
do yet is asserted too, marked ``xfail(strict=True)`` with the reason, so the test
turns into a failure to fix (remove the mark) the day it holds.

Skipped with the reason where the CLI is not installed (``python3 tests/agents/clis.py
install``; ``.ci/run`` does it) or a network namespace cannot be made (``unshare``).
"""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest

from tests.agents import clis
from tests.agents.measure import RunMeasures, measure
from tests.agents.run import netns_missing, run_isolated

WINDOWS = {"claude": 30_000, "codex": 16_000, "opencode": 16_000, "aider": 12_000}
"""ctxd's window in these tests: the short task's conversation goes over it (Claude Code's
system prompt and tools alone are ~19K tokens; Codex's and opencode's ~7.5K; aider's
prompt with its files ~7K)."""

NOT_YET: dict[str, dict[str, str]] = {}
"""What issue 21 asks that main does not do yet, per CLI: the reason of each strict xfail."""


def _skip_reason(cli: str) -> str | None:
    return netns_missing() or clis.missing(cli)


def _run_both(pool: ThreadPoolExecutor, cli: str, base: Path) -> dict[str, Future[dict[str, Any]]]:
    return {via: pool.submit(run_isolated, cli, via, base / f"{cli}-{via}.json", WINDOWS[cli], "short")
            for via in ("direct", "proxy")}


_RUNS: dict[str, dict[str, Future[dict[str, Any]]]] = {}


@pytest.fixture(scope="module")
def all_runs(request: pytest.FixtureRequest) -> Iterator[dict[str, dict[str, Future[dict[str, Any]]]]]:
    """The two runs of every CLI the session's tests ask for, started together: each run
    mostly waits on its CLI, its proxy or the scripted upstream, so side by side they
    take about as long as the slowest."""
    wanted = {item.callspec.params.get("runs") for item in request.session.items
              if getattr(item, "module", None) is request.module and hasattr(item, "callspec")}
    base = Path(tempfile.mkdtemp(prefix="ctxd-agents-test-"))
    with ThreadPoolExecutor(2 * len(clis.CLIS)) as pool:
        for cli in clis.CLIS:
            if cli in wanted and _skip_reason(cli) is None:
                _RUNS[cli] = _run_both(pool, cli, base)
        yield _RUNS
    shutil.rmtree(base, ignore_errors=True)


_CACHE: dict[str, dict[str, Any]] = {}


@pytest.fixture(scope="module", params=clis.CLIS)
def runs(request: pytest.FixtureRequest, all_runs: dict[str, dict[str, Future[dict[str, Any]]]]) -> dict[str, Any]:
    cli = request.param
    reason = _skip_reason(cli)
    if reason:
        pytest.skip(reason)
    if cli not in _CACHE:
        raw = {via: future.result() for via, future in all_runs[cli].items()}
        _CACHE[cli] = {"cli": cli, "raw": raw, "direct": measure(raw["direct"]), "proxy": measure(raw["proxy"])}
    return _CACHE[cli]


def _not_yet(request: pytest.FixtureRequest, cli: str, what: str) -> None:
    reason = NOT_YET.get(cli, {}).get(what)
    if reason:
        request.applymarker(pytest.mark.xfail(strict=True, reason=reason))


def _explain(m: RunMeasures, raw: dict[str, Any]) -> str:
    return (f"{m.cli} {m.via}: exit {m.returncode}, {m.requests} requests ({m.refused} refused: {m.refusals[:2]}), "
            f"output tail: {m.final_output[-200:]!r}\nstderr: {raw.get('stderr', '')[-800:]}\n"
            f"proxy log: {raw.get('proxy_log', '')[-1500:]}")


def test_direct_run_does_the_task(runs: dict[str, Any]) -> None:
    """The harness itself: the CLI, unchanged, talks to the scripted upstream (which accepts
    every request it makes, as the real API would), follows the script and fixes the bug."""
    m: RunMeasures = runs["direct"]
    assert m.fixed, _explain(m, runs["raw"]["direct"])
    assert m.refused == 0, m.refusals
    assert m.task_requests >= (4 if m.cli == "aider" else 10)  # the short task's steps (aider: its questions)
    assert m.newest_intact == m.newest_pairs  # direct: the tap and the upstream see the same requests
    if m.cli != "aider":  # aider rebuilds its prompt each turn; the others only append to theirs
        assert m.prefix_kept == m.prefix_pairs


def test_through_the_proxy_the_task_ends_the_same(runs: dict[str, Any], request: pytest.FixtureRequest) -> None:
    _not_yet(request, runs["cli"], "same_diff")
    direct, proxy = runs["direct"], runs["proxy"]
    assert proxy.fixed and proxy.diff == direct.diff, _explain(proxy, runs["raw"]["proxy"])


def test_direct_the_conversation_outgrows_the_window(runs: dict[str, Any]) -> None:
    """The test's window is below the conversation: the client's own requests go over it."""
    assert runs["direct"].max_tokens > runs["direct"].window


def test_through_the_proxy_fewer_tokens_are_sent(runs: dict[str, Any], request: pytest.FixtureRequest) -> None:
    """The whole task, for fewer tokens than the client's own requests."""
    _not_yet(request, runs["cli"], "compressed")
    assert runs["proxy"].fixed and runs["proxy"].tokens < runs["direct"].tokens


def test_through_the_proxy_every_request_is_accepted(runs: dict[str, Any], request: pytest.FixtureRequest) -> None:
    """What the proxy sends passes the provider's checks (tool calls paired, thinking
    blocks where Anthropic wants them and their signatures intact, at most 4 breakpoints)."""
    _not_yet(request, runs["cli"], "accepted")
    proxy = runs["proxy"]
    assert proxy.refused == 0, proxy.refusals


def test_through_the_proxy_one_session_per_conversation(runs: dict[str, Any],
                                                        request: pytest.FixtureRequest) -> None:
    _not_yet(request, runs["cli"], "one_session")
    proxy = runs["proxy"]
    assert proxy.task_sessions == 1 and proxy.task_forks == 0, \
        [(s["info"]["sessionId"], len(s["messages"])) for s in runs["raw"]["proxy"]["sessions"]]


def test_through_the_proxy_history_stored_once(runs: dict[str, Any], request: pytest.FixtureRequest) -> None:
    """The task's sessions store the conversation once: no more messages than it has
    (reasoning items, which ctxd leaves out, make it fewer)."""
    _not_yet(request, runs["cli"], "stored_once")
    proxy = runs["proxy"]
    assert 0 < proxy.stored <= proxy.conversation + 2, (proxy.stored, proxy.conversation)


def test_through_the_proxy_no_request_over_the_window(runs: dict[str, Any],
                                                      request: pytest.FixtureRequest) -> None:
    _not_yet(request, runs["cli"], "within_window")
    proxy = runs["proxy"]
    assert proxy.over_window == 0, f"{proxy.over_window} requests over {proxy.window}, the largest {proxy.max_tokens}"


def test_through_the_proxy_the_newest_turn_arrives_intact(runs: dict[str, Any],
                                                          request: pytest.FixtureRequest) -> None:
    _not_yet(request, runs["cli"], "newest_intact")
    proxy = runs["proxy"]
    assert proxy.newest_pairs > 0 and proxy.newest_intact == proxy.newest_pairs, \
        f"{proxy.newest_intact} of {proxy.newest_pairs}"


def test_through_the_proxy_the_clients_files_arrive_intact(runs: dict[str, Any],
                                                           request: pytest.FixtureRequest) -> None:
    """A repository file the client's request shows whole (as on disk) is whole upstream too."""
    _not_yet(request, runs["cli"], "files_intact")
    proxy = runs["proxy"]
    if not proxy.files_pairs:  # (0 of 0 would pass without anything compared)
        pytest.skip(f"{runs['cli']} showed no repository file whole in a request: nothing to compare")
    assert proxy.files_intact == proxy.files_pairs, f"{proxy.files_intact} of {proxy.files_pairs}"
