"""The README's examples and clients/python/agent_loop.py run as written."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests.cli.conftest import Cli
from tests.cli.test_watch_live import Lines

ROOT = Path(__file__).resolve().parents[2]
README = (ROOT / "README.md").read_text()


def code_blocks(language: str) -> list[str]:
    return re.findall(rf"^```{language}\n(.*?)^```", README, re.M | re.S)


@pytest.mark.process("the README's snippet, run as a script")
def test_the_python_snippet_runs_as_written(cli: Cli) -> None:
    (snippet,) = code_blocks("python")
    script = cli.root / "snippet.py"
    script.write_text(snippet)
    # Its configuration is the user's: here, the test's socket and data directory.
    run = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, env=cli.env, timeout=60)
    assert run.returncode == 0, run.stderr
    assert re.fullmatch(r"\d+ tokens: \[\{'role': 'user', 'content': 'Hello'\}\]\n", run.stdout)
    assert cli.daemon_pid() is not None  # it started the daemon, as ctxd-cli would have


@pytest.mark.process("ctxd-cli watch read while it runs, then Ctrl-C")
def test_the_commands_the_readme_suggests(cli: Cli) -> None:
    replayed = cli("replay", "--example").stdout
    shown = re.search(r"^```\n(  pushed .*?)^```", README, re.M | re.S)
    assert shown is not None
    labels = re.findall(r"^  (\w[\w ]*?) {2,}", shown.group(1), re.M)  # the fields shown are printed, in order
    assert len(labels) == 9
    assert labels == [lab for lab in re.findall(r"^  (\w[\w ]*?) {2,}", replayed, re.M) if lab in labels]
    for word in ("**`prompt`**", "**`max prompt`**", "**`used`**"):  # "used" and "prompt" told apart once
        assert word in README

    suggested = re.search(r"Then try (.*?)\.\n", README, re.S)
    assert suggested is not None
    commands = re.findall(r"`(ctxd-cli [^`]+)`", suggested.group(1))
    assert commands[0] == "ctxd-cli sessions list" and commands[-1] == "ctxd-cli daemon stop"
    for command in commands:
        args = [a.strip('"') for a in re.findall(r'"[^"]*"|\S+', command)][1:]
        if args[0] == "watch":  # runs until Ctrl-C
            watcher = cli.popen(*args)
            assert watcher.stderr is not None
            Lines(watcher.stderr).until("watching session")
            watcher.send_signal(2)
            assert watcher.wait(timeout=10) == 0
            continue
        result = cli(*args)
        assert result.stdout.strip(), command
    assert cli.daemon_pid() is None  # the last one stopped it


@pytest.mark.process("the example agent loop, which spawns ctxd over stdio")
def test_agent_loop_cleans_up_and_says_where_ctxd_comes_from(tmp_path: Path) -> None:
    script = ROOT / "clients" / "python" / "agent_loop.py"
    doc = script.read_text()
    assert "pip install ." in doc and "--ctxd .venv/bin/ctxd" in doc  # how to get ctxd on PATH
    run = subprocess.run([sys.executable, str(script), "--ctxd", f"{sys.executable} -m ctxd", "--turns", "2"],
                         capture_output=True, text=True, timeout=120, cwd=tmp_path)
    assert run.returncode == 0, run.stderr
    data_dir = re.search(r"data in (\S+)\)", run.stdout)
    assert data_dir is not None and f"removed {data_dir.group(1)}" in run.stdout
    assert not Path(data_dir.group(1)).exists()  # its temporary directory is gone
    missing = subprocess.run([sys.executable, str(script), "--ctxd", "no-such-ctxd-here"], capture_output=True,
                             text=True, timeout=60, cwd=tmp_path)
    assert missing.returncode != 0 and "Traceback" not in missing.stderr
    assert "not on PATH" in missing.stderr and "--ctxd" in missing.stderr
