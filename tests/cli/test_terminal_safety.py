"""Stored content never drives the terminal: every human-readable output of ctxd-cli
neutralises control sequences and control characters (through a pipe and on a real
pseudo-terminal, where rich draws), while ``--json`` prints content exactly."""

from __future__ import annotations

import json
import os
import pty
import select
import subprocess
import time

import pytest

from ctxd.cli import render
from tests.cli.conftest import CLI, Cli

# What a hostile transcript carries: a clipboard write (OSC 52, BEL-terminated), a window
# title (OSC 0, ST-terminated), a hyperlink (OSC 8), colours (CSI), the alternate screen,
# a device control string, an APC string, an 8-bit CSI, a terminal reset (ESC c), an ESC
# sequence, BEL, backspace, carriage return over the line, NUL, DEL and a lone ESC.
HOSTILE = ("clip\x1b]52;c;cm0gLXJmIH4K\x07 title\x1b]0;pwned\x1b\\ link\x1b]8;;http://evil\x1b\\here\x1b]8;;\x1b\\ "
           "red\x1b[31mtext\x1b[0m alt\x1b[?1049h dcs\x1bPq#0;2;0;0\x1b\\ apc\x1b_payload\x1b\\ c1\x9b2J "
           "reset\x1bc esc\x1b bell\x07 back\x08 over\rwrite nul\x00 del\x7f end lone\x1b")
BAD = ("\x1b", "\x07", "\x08", "\r", "\x00", "\x7f", "\x9b", "\x9c", "\x9d", "\x90")


def assert_inert(text: str) -> None:
    for char in BAD:
        assert char not in text, (char, text)
    assert not any(ord(c) < 0x20 and c not in "\n\t" for c in text), repr(text)
    for payload in ("cm0gLXJmIH4K", "pwned", "http://evil", "payload"):
        assert payload not in text, payload


def test_safe_neutralises_every_kind_of_sequence() -> None:
    safe = render.safe
    out = safe(HOSTILE)
    assert_inert(out)
    # (ESC SP b is a complete escape sequence, which a terminal would swallow whole too)
    assert out == ("clip title linkhere redtext alt dcs apc c1 reset escell\u2407 back\u2408 "
                   "over\u240dwrite nul\u2400 del\u2421 end lone\u241b")
    assert safe("line one\r\nline two\ttabbed") == "line one\nline two\ttabbed"
    assert safe("unterminated \x1b]0;still shown") == "unterminated 0;still shown"  # its text stays visible
    assert safe("plain text, ünïcödé, 日本語") == "plain text, ünïcödé, 日本語"


@pytest.fixture
def hostile(cli: Cli) -> Cli:
    messages = [{"role": "user", "content": "first line " + HOSTILE},
                {"role": "assistant", "content": HOSTILE}]
    cli("push", "evil\x1b]0;id\x07", "--create", "--message-json", input=json.dumps(messages))
    cli("sessions", "update", "evil\x1b]0;id\x07", "--title", "Title \x1b]0;pwned\x07 \x1b[31mred\x1b[0m\x9b2J")
    return cli


COMMANDS = [(("sessions", "list"), "Title  red"), (("sessions", "show", "evil\x1b]0;id\x07"), "Title  red"),
            (("history", "evil\x1b]0;id\x07"), "redtext alt dcs"), (("search", "clip"), "clip"),
            (("stats", "evil\x1b]0;id\x07"), "evil")]


def test_human_output_through_a_pipe_is_inert(hostile: Cli) -> None:
    for args, shown in COMMANDS:
        result = hostile(*args)
        assert_inert(result.stdout)
        assert_inert(result.stderr)
        assert shown in result.stdout, (args, result.stdout)
    # An error quoting what it was given: inert too (the daemon quotes it escaped, as repr).
    refused = hostile("history", "nope\x1b]52;c;cm0gLXJmIH4K\x07", expect=1)
    assert not any(ord(c) < 0x20 and c != "\n" for c in refused.stderr), refused.stderr
    assert "\\x1b" in refused.stderr


def test_json_output_stays_exact(hostile: Cli) -> None:
    history = hostile.json("history", "evil\x1b]0;id\x07")
    texts = [m["message"]["content"] for m in history["messages"]]
    assert texts == ["first line " + HOSTILE, HOSTILE]


def run_on_a_terminal(cli: Cli, *args: str, timeout: float = 60) -> str:
    """``ctxd-cli ARGS`` with stdout and stderr on a pseudo-terminal (so rich draws): what it wrote."""
    master, slave = pty.openpty()
    env = dict(cli.env, COLUMNS="200", LINES="50", TERM="xterm-256color")
    proc = subprocess.Popen([*CLI, *args], stdin=subprocess.DEVNULL, stdout=slave, stderr=slave, env=env)
    os.close(slave)
    out = bytearray()
    deadline = time.monotonic() + timeout
    try:
        while time.monotonic() < deadline:
            ready, _, _ = select.select([master], [], [], 0.1)
            if ready:
                try:
                    chunk = os.read(master, 65536)
                except OSError:  # the child closed its side
                    break
                if not chunk:
                    break
                out += chunk
            elif proc.poll() is not None:
                break
        proc.wait(timeout=10)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        os.close(master)
    assert proc.returncode == 0, out.decode("utf-8", "replace")
    return out.decode("utf-8", "replace")


@pytest.mark.process("ctxd-cli on a pseudo-terminal")
def test_human_output_on_a_terminal_is_inert(hostile: Cli) -> None:
    for args, shown in COMMANDS[:3]:
        text = run_on_a_terminal(hostile, *args)
        # rich colours its own output (CSI SGR sequences are its, and harmless); nothing else
        # may reach the terminal: no OSC, DCS, APC, reset, C1, and none of the payloads.
        without_sgr = __import__("re").sub(r"\x1b\[[0-9;]*m", "", text)
        for payload in ("cm0gLXJmIH4K", "pwned", "http://evil", "payload", "\x1b]", "\x1bP", "\x1b_", "\x1bc",
                        "\x9b", "\x07", "\x00", "\x7f", "\x08", "\x1b[?1049h", "\x1b[2J"):
            assert payload not in without_sgr, (args, payload)
        assert "\x1b" not in without_sgr.replace("\x1b[?25l", "").replace("\x1b[?25h", ""), (args, without_sgr)
        assert shown in without_sgr, (args, without_sgr)


def test_verbose_and_debug_logs_are_inert(hostile: Cli) -> None:
    """``-v``/``--debug`` write the requests, the answers (stored content) and the daemon's
    refusals on stderr, to the same terminal: neutralised as well."""
    for args in (("--debug", "history", "evil\x1b]0;id\x07"), ("-v", "history", "nope\x1b]52;c;cm0gLXJmIH4K\x07"),
                 ("--debug", "search", "clip")):
        result = hostile(*args, expect=None)
        assert "ctxd-cli:" in result.stderr, result.stderr
        for char in BAD:  # (the payloads may show, JSON-escaped: inert)
            assert char not in result.stderr, (args, char, result.stderr)
        assert not any(ord(c) < 0x20 and c not in "\n\t" for c in result.stderr), result.stderr
