"""``ctxd-cli``: the shell client of the ctxd daemon.

Every command connects to the daemon's Unix socket and, when none answers, starts a
detached daemon there first (like ``gopls -remote=auto``), unless ``--no-autostart``
is given; ``daemon status`` and ``daemon stop`` never start one.

Exit codes (also in ``ctxd-cli --help``):

    0  success
    1  the daemon refused the request (a JSON-RPC error; ``error: <message> (<code>)`` on stderr)
    2  usage error (bad flags or arguments, bad configuration)
    3  the daemon is unreachable or could not be started (the line names the socket or log)
    4  bad input file (a transcript or JSON the command could not read)

Errors are one ``error: ...`` line on stderr, never a traceback. With ``--json``
stdout carries nothing but the JSON result.
"""

from __future__ import annotations

import asyncio
import errno
import os
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any, Awaitable, Callable, TypeVar

import click

from ctxd.client import Client, DaemonUnavailable, RpcError, connect_or_start, spawn_daemon
from ctxd.config import Config, ConfigError, load_config

T = TypeVar("T")

EXIT_OK = 0
EXIT_REFUSED = 1
EXIT_USAGE = 2
EXIT_UNAVAILABLE = 3
EXIT_BAD_INPUT = 4

CLIENT_NAME = "ctxd-cli"
START_WAIT_SECONDS = 15.0

EPILOG = """\b
Exit codes:
  0  success
  1  the daemon refused the request (error: <message> (<code>) on stderr)
  2  usage error (bad flags, arguments or configuration)
  3  the daemon is unreachable or could not be started
  4  bad input file (transcript or JSON)

\b
The socket and data directory default to the configuration (CTXD_DAEMON_SOCKET,
CTXD_DAEMON_DATA_DIR, ~/.config/ctxd/config.toml). Shell completion:
eval "$(ctxd-cli completion bash)"."""


class CliError(click.ClickException):
    """A failure with its exit code, shown as one ``error:`` line on stderr."""

    def __init__(self, message: str, exit_code: int) -> None:
        super().__init__(message)
        # click declares exit_code on the class and reads it from the instance.
        self.exit_code = exit_code  # type: ignore[misc]

    def show(self, file: IO[Any] | None = None) -> None:
        from ctxd.cli.render import safe  # the message may quote stored content (a session id)

        click.echo(safe(f"error: {self.format_message()}"), err=True)


def bad_input(message: str) -> CliError:
    return CliError(message, EXIT_BAD_INPUT)


def stdin_is_terminal() -> bool:
    try:
        return sys.stdin.isatty()
    except (AttributeError, ValueError):
        return False


def require_terminal(what: str) -> None:
    """Refuse (exit 2) to do ``what`` without --yes when there is no terminal to ask on.

    Checked before anything else, so a script gets the same answer whatever the data."""
    if not stdin_is_terminal():
        raise CliError(f"not {what} without confirmation: stdin is not a terminal to ask on; "
                       "add --yes to go ahead", EXIT_USAGE)


def confirm(question: str, *, yes: bool) -> bool:
    """Whether to go ahead with something hard to undo: ``--yes`` always does; on a
    terminal the question is asked on stderr (default no; Ctrl-C exits 130); without a
    terminal there is nobody to ask and it goes ahead (call :func:`require_terminal`
    first for what must not happen unasked)."""
    if yes or not stdin_is_terminal():
        return True
    try:
        return click.confirm(question, default=False, err=True)
    except click.Abort:
        raise click.exceptions.Exit(130) from None


@dataclass
class Settings:
    """The global options; the configuration is loaded on first use so that
    ``completion`` and ``--help`` work even with a broken config file."""

    socket: str | None = None
    data_dir: str | None = None
    config_file: str | None = None
    autostart: bool = True
    json: bool = False
    _config: Config | None = field(default=None, repr=False)

    @property
    def config(self) -> Config:
        if self._config is None:
            overrides: dict[str, Any] = {}
            if self.socket:
                overrides.setdefault("daemon", {})["socket"] = self.socket
            if self.data_dir:
                overrides.setdefault("daemon", {})["data_dir"] = self.data_dir
            try:
                self._config = load_config(self.config_file, overrides=overrides)
            except ConfigError as exc:
                raise CliError(f"configuration: {exc}", EXIT_USAGE) from None
        return self._config

    @property
    def socket_path(self) -> Path:
        return self.config.socket_path

    @property
    def log_path(self) -> Path:
        """Where a daemon started by ctxd-cli logs (next to its socket, as ``spawn_daemon`` puts it)."""
        return self.socket_path.with_name("daemon.log")


def settings_of(ctx: click.Context) -> Settings:
    obj = ctx.find_root().obj
    if obj is None:
        obj = ctx.find_root().obj = Settings()
    return obj  # type: ignore[no-any-return]


def _set_json(ctx: click.Context, param: click.Parameter, value: bool) -> None:
    if value:
        settings_of(ctx).json = True


def json_option(fn: Callable[..., Any]) -> Callable[..., Any]:
    """``--json`` on a subcommand, the same as the global ``ctxd-cli --json``."""
    return click.option("--json", "json_", is_flag=True, expose_value=False, callback=_set_json,
                        help="Print the daemon's result as JSON (and nothing else) on stdout.")(fn)


# --- connecting --------------------------------------------------------------------


async def initialize_client(client: Client) -> Client:
    await client.initialize(client_name=CLIENT_NAME, process_id=os.getpid())
    return client


async def try_connect(socket: Path) -> Client | None:
    try:
        return await Client.connect_unix(socket)
    except DaemonUnavailable:
        return None
    except OSError as exc:  # a permission problem, a path too long for a socket...
        raise DaemonUnavailable(f"cannot connect to {socket}: {exc.strerror or exc}") from None


def _log_tail(path: Path, offset: int) -> str:
    try:
        with open(path, "rb") as f:
            f.seek(offset)
            lines = [ln for ln in f.read().decode("utf-8", "replace").splitlines() if ln.strip()]
    except OSError:
        return ""
    return lines[-1] if lines else ""


async def wait_for_daemon(socket: Path, seconds: float, *, process: Any = None,
                          log_path: Path | None = None, log_offset: int = 0) -> Client | None:
    """Poll the socket until a daemon answers; None after ``seconds``.

    ``process`` is the daemon we spawned: if it exits because another ctxd already
    holds the socket (two ctxd-cli autostarting at once), we keep waiting for that
    one; if it fails for any other reason, its last log line is raised.
    """
    deadline = time.monotonic() + seconds
    while True:
        client = await try_connect(socket)
        if client is not None:
            return await initialize_client(client)
        if process is not None and process.poll() not in (None, 0):
            process = None
            reason = _log_tail(log_path, log_offset) if log_path else ""
            if "already serving" not in reason:
                await asyncio.sleep(0.2)  # a daemon that won the socket may have just begun listening
                client = await try_connect(socket)
                if client is not None:
                    return await initialize_client(client)
                where = f" (log: {log_path})" if log_path else ""
                raise DaemonUnavailable(f"ctxd could not start on {socket}: {reason or 'it exited'}{where}")
            # Another ctxd holds the socket and is starting up: keep waiting for it.
        if time.monotonic() > deadline:
            return None
        await asyncio.sleep(0.05)


async def start_daemon(settings: Settings, *, idle_exit: float | None = None) -> Client:
    """Start a detached daemon on the configured socket (``ctxd-cli daemon start``: it
    stays up as the configuration says, unless ``idle_exit``) and connect to it."""
    socket, log_path = settings.socket_path, settings.log_path
    offset = log_path.stat().st_size if log_path.exists() else 0
    try:
        process = spawn_daemon(socket, data_dir=settings.data_dir, config_file=settings.config_file,
                               log_path=log_path, idle_exit=idle_exit, autostarted=False)
    except OSError as exc:
        raise DaemonUnavailable(f"cannot start ctxd for {socket}: {exc}") from None
    client = await wait_for_daemon(socket, START_WAIT_SECONDS, process=process,
                                   log_path=log_path, log_offset=offset)
    if client is None:
        raise DaemonUnavailable(f"ctxd did not open {socket} within {START_WAIT_SECONDS:.0f} s (log: {log_path})")
    return client


async def _autostart(settings: Settings) -> Client:
    socket = settings.socket_path
    try:
        return await connect_or_start(socket, autostart=True, data_dir=settings.data_dir,
                                      config_file=settings.config_file, client_name=CLIENT_NAME,
                                      wait_seconds=START_WAIT_SECONDS)
    except DaemonUnavailable as exc:
        # connect_or_start gives up when the daemon it spawned exits, which is what
        # the loser of two simultaneous autostarts does; the winner is then starting.
        message = str(exc)
        patience = START_WAIT_SECONDS if "already serving" in message else 1.0
        client = await wait_for_daemon(socket, patience)
        if client is not None:
            return client
        if str(settings.log_path) not in message:
            message += f" (log: {settings.log_path})"
        raise DaemonUnavailable(message) from None


async def connect(settings: Settings, *, autostart: bool | None = None) -> tuple[Client, bool]:
    """An initialized client, and whether a daemon had to be started for it."""
    socket = settings.socket_path
    client = await try_connect(socket)
    if client is not None:
        return await initialize_client(client), False
    if not (settings.autostart if autostart is None else autostart):
        raise DaemonUnavailable(f"no ctxd daemon is running on {socket} (start one with: ctxd-cli daemon start)")
    return await _autostart(settings), True


async def check_data_dir(client: Client, settings: Settings) -> None:
    """An explicit data dir must be the one the daemon on this socket serves."""
    if not settings.config.daemon.data_dir:
        return
    status = await client.request("daemon/status")
    served = Path(status["dataDir"]).expanduser().resolve()
    wanted = settings.config.data_dir.resolve()
    if served != wanted:
        raise CliError(f"the ctxd daemon on {settings.socket_path} serves {served}, not {wanted}; "
                       "give another --socket, or stop it with: ctxd-cli daemon stop", EXIT_UNAVAILABLE)


def request(settings: Settings, method: str, params: Any = None, *, autostart: bool | None = None,
            verify_data_dir: bool = True) -> Any:
    """One request's result (what most commands need), with :func:`run`'s error handling."""

    async def work(client: Client) -> Any:
        return await client.request(method, params)

    return run(settings, work, autostart=autostart, verify_data_dir=verify_data_dir)


def run(settings: Settings, work: Callable[[Client], Awaitable[T]], *, autostart: bool | None = None,
        interrupt_code: int = 130, verify_data_dir: bool = True) -> T:
    """Run ``work`` with a connected client; map failures to exit codes and one-line errors."""

    async def go() -> T:
        client, started = await connect(settings, autostart=autostart)
        try:
            if started and sys.stderr.isatty() and not settings.json:
                from ctxd.cli.render import note

                note(f"started ctxd on {settings.socket_path} (log: {settings.log_path})")
            if verify_data_dir:
                await check_data_dir(client, settings)
            return await work(client)
        finally:
            await client.close()

    try:
        return asyncio.run(go())
    except RpcError as exc:
        raise CliError(f"{exc.message} ({exc.code})", EXIT_REFUSED) from None
    except DaemonUnavailable as exc:
        raise CliError(str(exc), EXIT_UNAVAILABLE) from None
    except KeyboardInterrupt:
        click.echo("", err=True)
        raise click.exceptions.Exit(interrupt_code) from None


# --- the group ---------------------------------------------------------------------


class CtxdGroup(click.Group):
    """Adds quiet handling of a closed stdout pipe (``ctxd-cli prompt s | head``), and
    registers the commands when they are first looked up: the command modules import
    this one, so any of them can be imported first (tests do) without an import cycle."""

    _registered = False

    def _ensure_commands(self) -> None:
        if not CtxdGroup._registered:
            CtxdGroup._registered = True
            _register()

    def list_commands(self, ctx: click.Context) -> list[str]:
        self._ensure_commands()
        return super().list_commands(ctx)

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        self._ensure_commands()
        return super().get_command(ctx, cmd_name)

    def invoke(self, ctx: click.Context) -> Any:
        try:
            return super().invoke(ctx)
        except OSError as exc:  # BrokenPipeError included
            if exc.errno != errno.EPIPE:
                raise
            # The reader went away: stop quietly, and keep the interpreter's final flush quiet too.
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
            raise click.exceptions.Exit(EXIT_OK) from None


class AliasGroup(click.Group):
    """A group that also answers to other names for some commands, without listing
    them in ``--help`` (``sessions view`` for ``sessions show``, as seed 003 calls it)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.aliases: dict[str, click.Command] = {}

    def alias(self, name: str, command: click.Command) -> None:
        self.aliases[name] = command

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        return super().get_command(ctx, cmd_name) or self.aliases.get(cmd_name)


@click.group(cls=CtxdGroup, epilog=EPILOG, context_settings={"help_option_names": ["-h", "--help"]})
@click.option("--socket", metavar="PATH", help="The daemon's Unix socket (default: from the configuration).")
@click.option("--data-dir", metavar="DIR", help="Data directory for a daemon ctxd-cli starts (and the one expected).")
@click.option("--config", "config_file", metavar="FILE", help="Configuration file (default ~/.config/ctxd/config.toml).")
@click.option("--no-autostart", is_flag=True, help="Fail (exit 3) instead of starting a daemon when none answers.")
@click.option("--json", "json_", is_flag=True, help="Print machine-readable JSON (and nothing else) on stdout.")
@click.version_option(package_name="ctxd", prog_name="ctxd-cli", message="%(prog)s %(version)s")
@click.pass_context
def cli(ctx: click.Context, socket: str | None, data_dir: str | None, config_file: str | None,
        no_autostart: bool, json_: bool) -> None:
    """Talk to the ctxd context daemon: sessions, history, search, compression,
    snapshots, goals, live watching; and check its database (doctor)."""
    settings = settings_of(ctx)
    settings.socket = socket
    settings.data_dir = data_dir
    settings.config_file = config_file
    settings.autostart = not no_autostart
    settings.json = settings.json or json_


def main(argv: list[str] | None = None) -> int:
    """Console-script entry point."""
    os.umask(0o077)  # exports (and a daemon's log, when it starts one) are for this user only
    try:
        cli.main(args=argv, prog_name="ctxd-cli", complete_var="_CTXD_CLI_COMPLETE", standalone_mode=True)
    except SystemExit as exc:
        return exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
    return EXIT_OK


def _register() -> None:
    from ctxd.cli import (context, daemon, doctor, history, prompt, push, replay, sessions, snapshots, stats,
                          transfer, watch)

    for command in (sessions.sessions, push.push, prompt.prompt, stats.stats, history.history, history.search,
                    context.compress, context.checkpoints, context.expand, context.pin, context.goal,
                    snapshots.snapshot, transfer.export, transfer.import_, replay.replay, watch.watch,
                    doctor.doctor, daemon.daemon, daemon.completion):
        cli.add_command(command)


if __name__ == "__main__":
    # Run the importable copy of this module, the one the command modules register on.
    from ctxd.cli.main import main as _main

    sys.exit(_main())
