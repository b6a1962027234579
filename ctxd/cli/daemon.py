"""``ctxd-cli daemon status|stop|start`` and ``ctxd-cli completion``."""

from __future__ import annotations

import asyncio
import os
import time
from typing import Any

import click

from ctxd.cli import render
from ctxd.cli.main import (
    EXIT_UNAVAILABLE,
    EXIT_USAGE,
    START_WAIT_SECONDS,
    CliError,
    check_data_dir,
    initialize_client,
    json_option,
    request,
    rpc_error,
    settings_of,
    try_connect,
)
from ctxd.client import DaemonUnavailable, RpcError, start_daemon

STOP_WAIT_SECONDS = 10.0


@click.group("daemon")
def daemon() -> None:
    """Start, stop and inspect the background daemon."""


def status_pairs(status: dict[str, Any]) -> list[tuple[str, Any]]:
    return [
        ("pid", status["pid"]),
        ("version", status["version"]),
        ("started", f"{status['startedAt']} (up {render.duration(status['uptimeSeconds'])})"),
        ("transports", ", ".join(status["transports"]) or "-"),
        ("connections", render.num(status["connections"])),
        ("sessions", render.num(status["sessions"])),
        ("data dir", status["dataDir"]),
        ("database", status["database"]),
        ("durability", status["durability"]),
        ("summarizer", status["summarizer"]),
    ]


@daemon.command("status")
@json_option
@click.pass_context
def status(ctx: click.Context) -> None:
    """The running daemon's status (exit 3 when none runs; never starts one)."""
    settings = settings_of(ctx)

    result = request(settings, "daemon/status", autostart=False, verify_data_dir=False)
    if settings.json:
        render.print_json(result)
        return
    render.fields(status_pairs(result))


def _process_gone(pid: int) -> bool:
    """Whether ``pid`` has exited (a zombie nobody reaped counts as exited)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    except PermissionError:
        return False
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            return f.read().rsplit(b")", 1)[1].split()[0] == b"Z"
    except (OSError, IndexError):
        return False


@daemon.command("stop")
@json_option
@click.pass_context
def stop(ctx: click.Context) -> None:
    """Stop the daemon and wait until it has exited (exit 0 also when none was running)."""
    settings = settings_of(ctx)
    socket = settings.endpoint

    async def work() -> int | None:
        client = await try_connect(settings)
        if client is None:
            return None
        try:
            await initialize_client(client, settings)
            pid = (await client.request("daemon/status"))["pid"]
            await client.request("daemon/stop")
        finally:
            await client.close(shutdown=False)
        deadline = time.monotonic() + STOP_WAIT_SECONDS
        while not _process_gone(pid):
            if time.monotonic() > deadline:
                raise CliError(f"asked ctxd (pid {pid}) on {socket} to stop, but it is still running after "
                               f"{STOP_WAIT_SECONDS:.0f} s", EXIT_UNAVAILABLE)
            await asyncio.sleep(0.05)
        return int(pid)

    try:
        pid = asyncio.run(work())
    except RpcError as exc:
        raise rpc_error(exc) from None
    except DaemonUnavailable as exc:
        raise CliError(str(exc), EXIT_UNAVAILABLE) from None
    except KeyboardInterrupt:
        raise click.exceptions.Exit(130) from None
    if settings.json:
        render.print_json({"socket": str(socket), "wasRunning": pid is not None, "pid": pid})
    elif pid is None:
        render.line(f"no ctxd daemon was running on {socket}")
    else:
        render.line(f"stopped ctxd (pid {pid}) on {socket}")


@daemon.command("start")
@click.option("--idle-exit", type=click.FloatRange(min=0), default=None, metavar="SECONDS",
              help="Exit after this long without connections (0: never; default: daemon.idle_exit_seconds). "
                   "Daemons that other commands start on demand use daemon.autostart_idle_exit_seconds (900).")
@json_option
@click.pass_context
def start(ctx: click.Context, idle_exit: float | None) -> None:
    """Start the daemon in the background unless one is running; print its socket and pid."""
    settings = settings_of(ctx)
    if settings.tcp is not None:
        raise CliError(f"ctxd-cli starts daemons on the Unix socket only; start one serving TCP with: "
                       f"ctxd --tcp {settings.tcp}", EXIT_USAGE)
    socket = settings.socket_path

    async def work() -> tuple[dict[str, Any], bool]:
        client = await try_connect(settings)
        started = client is None
        if client is None:
            client = await start_daemon(socket, data_dir=settings.data_dir, config_file=settings.config_file,
                                        idle_exit=idle_exit, autostarted=False,
                                        log_file=settings.config.daemon.log_file or None,
                                        wait_seconds=START_WAIT_SECONDS)
        client = await initialize_client(client, settings)
        try:
            await check_data_dir(client, settings)
            return await client.request("daemon/status"), started
        finally:
            await client.close()

    try:
        status, started = asyncio.run(work())
    except RpcError as exc:
        raise rpc_error(exc) from None
    except DaemonUnavailable as exc:
        raise CliError(str(exc), EXIT_UNAVAILABLE) from None
    except KeyboardInterrupt:
        raise click.exceptions.Exit(130) from None
    if settings.json:
        render.print_json({**status, "started": started, "socket": str(socket), "log": str(settings.log_path)})
        return
    verb = "started ctxd in the background" if started else "already running: ctxd"
    render.line(f"{verb} (pid {status['pid']}) on {socket}")
    pairs = [("data dir", status["dataDir"])]
    if started:
        pairs.append(("log", str(settings.log_path)))
    render.fields(pairs)


@click.command("completion")
@click.argument("shell", type=click.Choice(["bash", "zsh", "fish"]))
@click.pass_context
def completion(ctx: click.Context, shell: str) -> None:
    """Print the shell completion script for SHELL.

    \b
      bash:  eval "$(ctxd-cli completion bash)"       (in ~/.bashrc)
      zsh:   eval "$(ctxd-cli completion zsh)"        (in ~/.zshrc)
      fish:  ctxd-cli completion fish > ~/.config/fish/completions/ctxd-cli.fish
    """
    from click.shell_completion import get_completion_class

    cls = get_completion_class(shell)
    assert cls is not None
    root = ctx.find_root().command
    click.echo(cls(root, {}, "ctxd-cli", "_CTXD_CLI_COMPLETE").source())
