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

Errors are one ``error: ...`` line on stderr, never a traceback (``--debug`` adds
it). With ``--json`` stdout carries nothing but the JSON result, or, on failure,
``{"error": {"message", "exitCode", "code", "data"}}``.
"""

from __future__ import annotations

import asyncio
import errno
import json
import logging
import os
import sys
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any, TypeVar

import click

from ctxd.client import (
    Client,
    DaemonUnavailable,
    ForeignDaemon,
    RpcError,
    daemon_log_path,
    start_daemon,
    try_connect_unix,
)
from ctxd.config import Config, ConfigError, load_config
from ctxd.ids import LAST, match_ids
from ctxd.ownership import PrivateFileError, read_private_file
from ctxd.protocol.errors import ErrorCode

log = logging.getLogger("ctxd.cli")

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
SESSION is a session id, a unique prefix of one, or "last" (the most
recently active session). Where the socket, data, log and token file
are: ctxd-cli paths; every setting and where it comes from: ctxd-cli
config. Budget figures (prompt, used, max prompt): ctxd-cli stats --help.
Shell completion: eval "$(ctxd-cli completion bash)"."""


class CliError(click.ClickException):
    """A failure with its exit code, shown as one ``error:`` line on stderr (and, under
    ``--json``, as ``{"error": ...}`` on stdout). ``code``/``data``: the daemon's error."""

    def __init__(self, message: str, exit_code: int, *, code: int | None = None, data: Any = None) -> None:
        super().__init__(message)
        # click declares exit_code on the class and reads it from the instance.
        self.exit_code = exit_code  # type: ignore[misc]
        self.code = code
        self.data = data

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
    tcp: int | None = None
    token_file: str | None = None
    autostart: bool = True
    json: bool = False
    verbose: int = 0
    _config: Config | None = field(default=None, repr=False)

    def overrides(self) -> dict[str, Any]:
        """What the flags set, as configuration keys (``ctxd-cli config`` shows them as "flag")."""
        out: dict[str, Any] = {}
        for key, value in (("socket", self.socket), ("data_dir", self.data_dir), ("token_file", self.token_file)):
            if value:
                out.setdefault("daemon", {})[key] = value
        return out

    def use_data_dir(self, data_dir: str) -> None:
        """Another data directory than the flags gave (a subcommand's own option): the
        configuration is loaded again with it."""
        self.data_dir = data_dir
        self._config = None

    @property
    def config(self) -> Config:
        if self._config is None:
            try:
                self._config = load_config(self.config_file, overrides=self.overrides())
            except ConfigError as exc:
                raise CliError(f"configuration: {exc}", EXIT_USAGE) from None
        return self._config

    @property
    def socket_path(self) -> Path:
        return self.config.socket_path

    @property
    def log_path(self) -> Path:
        """Where a daemon started by ctxd-cli logs: ``daemon.log_file``, else ``daemon.log``
        next to its socket (as ``spawn_daemon`` puts it)."""
        return daemon_log_path(self.socket_path, self.config.daemon.log_file or None)

    @property
    def token_path(self) -> Path:
        return self.config.token_path

    @property
    def endpoint(self) -> str:
        """What ctxd-cli talks to, for messages: the socket, or 127.0.0.1:PORT."""
        return f"127.0.0.1:{self.tcp}" if self.tcp is not None else str(self.socket_path)


_json_requested = False
"""Whether --json was given, for errors raised before (or after) a command's Settings."""


def settings_of(ctx: click.Context) -> Settings:
    obj = ctx.find_root().obj
    if obj is None:
        obj = ctx.find_root().obj = Settings()
    return obj


def _set_json(ctx: click.Context, param: click.Parameter, value: bool) -> None:
    global _json_requested
    if value:
        settings_of(ctx).json = True
        _json_requested = True


def json_option(fn: Callable[..., Any]) -> Callable[..., Any]:
    """``--json`` on a subcommand, the same as the global ``ctxd-cli --json``."""
    return click.option("--json", "json_", is_flag=True, expose_value=False, callback=_set_json,
                        help="Print the result as JSON (and nothing else) on stdout; errors too, as "
                             "{\"error\": ...}.")(fn)


# --- connecting --------------------------------------------------------------------


async def initialize_client(client: Client, settings: Settings | None = None) -> Client:
    """``initialize`` on a new connection; over TCP with the token from the token file."""
    token = read_token(settings) if settings is not None and settings.tcp is not None else None
    try:
        await client.initialize(client_name=CLIENT_NAME, process_id=os.getpid(), token=token)
    except RpcError as exc:
        await client.close(shutdown=False)
        if exc.code == ErrorCode.Unauthorized and settings is not None:
            raise CliError(f"{exc.message} ({exc.code}); ctxd-cli sent the token in {settings.token_path} "
                           f"(daemon.token_file, or --token-file), not the one the daemon on {settings.endpoint} "
                           "reads from its own daemon.token_file", EXIT_REFUSED, code=exc.code, data=exc.data) from None
        raise
    return client


def read_token(settings: Settings) -> str:
    """The token to send: read as the daemon reads it (``read_private_file``), since it is
    sent to whatever listens on the port."""
    path = settings.token_path
    try:
        token = read_private_file(path, "TCP token file")
    except FileNotFoundError:
        raise CliError(f"no TCP token file at {path}: a daemon started with --tcp creates it (its "
                       "daemon.token_file); give that file with --token-file", EXIT_UNAVAILABLE) from None
    except PrivateFileError as exc:
        raise CliError(f"{exc}; nothing was sent", EXIT_UNAVAILABLE) from None
    if not token:
        raise CliError(f"the TCP token file {path} is empty", EXIT_UNAVAILABLE)
    return token


async def try_connect(settings: Settings) -> Client | None:
    """A connection (not initialized) to the daemon ctxd-cli talks to, or None when none answers."""
    if settings.tcp is not None:
        try:
            return await Client.connect_tcp(settings.tcp, unchecked=settings.config.daemon.tcp_allow_unchecked)
        except ForeignDaemon:
            raise
        except DaemonUnavailable:
            return None
    return await try_connect_unix(settings.socket_path)


def _idle_phrase(seconds: float) -> str:
    if not seconds:
        return "it keeps running until stopped (ctxd-cli daemon stop)"
    minutes = seconds / 60
    span = f"{minutes:g} min" if minutes >= 1 else f"{seconds:g} s"
    return f"it exits after {span} without clients (daemon.autostart_idle_exit_seconds)"


async def connect(settings: Settings, *, autostart: bool | None = None) -> tuple[Client, bool]:
    """An initialized client, and whether a daemon had to be started for it."""
    log.info("configuration: %s", _config_source(settings))
    log.info("daemon: %s", settings.endpoint)
    client = await try_connect(settings)
    if client is not None:
        return await initialize_client(client, settings), False
    if settings.tcp is not None:
        raise DaemonUnavailable(f"no ctxd daemon answers on {settings.endpoint} (ctxd-cli starts daemons on the "
                                f"Unix socket only; start one with: ctxd --tcp {settings.tcp})")
    if not (settings.autostart if autostart is None else autostart):
        raise DaemonUnavailable(f"no ctxd daemon is running on {settings.socket_path} "
                                "(start one with: ctxd-cli daemon start)")
    config = settings.config
    client = await start_daemon(settings.socket_path, data_dir=settings.data_dir, config_file=settings.config_file,
                                log_file=config.daemon.log_file or None, wait_seconds=START_WAIT_SECONDS)
    if client.started_daemon is not None:
        from ctxd.cli.render import note

        note(f"started ctxd in the background (pid {client.started_daemon}) on {settings.socket_path}; "
             f"it logs to {settings.log_path}; {_idle_phrase(config.daemon.autostart_idle_exit_seconds)}")
    return await initialize_client(client, settings), client.started_daemon is not None


def _config_source(settings: Settings) -> str:
    from ctxd.config import default_config_file

    explicit = settings.config_file or os.environ.get("CTXD_CONFIG")
    path = Path(explicit).expanduser() if explicit else default_config_file()
    return f"{path}" + ("" if path.exists() else " (not found: defaults)")


async def check_data_dir(client: Client, settings: Settings) -> None:
    """An explicit data dir must be the one the daemon on this socket serves."""
    if not settings.config.daemon.data_dir:
        return
    status = await client.request("daemon/status")
    served = Path(status["dataDir"]).expanduser().resolve()
    wanted = settings.config.data_dir.resolve()
    if served != wanted:
        other = "--tcp PORT" if settings.tcp is not None else "--socket"
        raise CliError(f"the ctxd daemon on {settings.endpoint} serves {served}, not {wanted}; "
                       f"give another {other}, or stop it with: ctxd-cli daemon stop", EXIT_UNAVAILABLE)


def request(settings: Settings, method: str, params: Any = None, *, autostart: bool | None = None,
            verify_data_dir: bool = True) -> Any:
    """One request's result (what most commands need), with :func:`run`'s error handling."""

    async def work(client: Client) -> Any:
        return await client.request(method, params)

    return run(settings, work, autostart=autostart, verify_data_dir=verify_data_dir)


def rpc_error(exc: RpcError) -> CliError:
    return CliError(f"{exc.message} ({exc.code})", EXIT_REFUSED, code=exc.code, data=exc.data)


def run(settings: Settings, work: Callable[[Client], Awaitable[T]], *, autostart: bool | None = None,
        interrupt_code: int = 130, verify_data_dir: bool = True) -> T:
    """Run ``work`` with a connected client; map failures to exit codes and one-line errors."""

    async def go() -> T:
        client, _ = await connect(settings, autostart=autostart)
        try:
            if verify_data_dir:
                await check_data_dir(client, settings)
            return await work(client)
        finally:
            await client.close()

    try:
        return asyncio.run(go())
    except RpcError as exc:
        raise rpc_error(exc) from None
    except DaemonUnavailable as exc:
        raise CliError(str(exc), EXIT_UNAVAILABLE) from None
    except KeyboardInterrupt:
        click.echo("", err=True)
        raise click.exceptions.Exit(interrupt_code) from None


# --- session arguments ---------------------------------------------------------------

async def resolve_session_id(client: Client, given: str) -> str:
    """``given`` as a session id: the session of that id if there is one, else ``last``
    (the most recently active session) or the one session whose id starts with it; when
    nothing matches, ``given`` itself (the daemon then says it does not exist)."""
    try:
        await client.request("session/get", {"sessionId": given})
        return given
    except RpcError as exc:
        if exc.code != ErrorCode.SessionNotFound:
            return given
    sessions = (await client.request("session/list"))["sessions"]
    if given == LAST:
        if not sessions:
            raise CliError("there are no sessions, so \"last\" names none", EXIT_REFUSED)
        latest = max(sessions, key=lambda s: s.get("lastActivity") or "")
        log.info("session %r is %s (the most recently active)", given, latest["sessionId"])
        return str(latest["sessionId"])
    matches = match_ids(given, [s["sessionId"] for s in sessions])
    if len(matches) > 1:
        shown = ", ".join(matches[:5]) + (f" and {len(matches) - 5} more" if len(matches) > 5 else "")
        raise CliError(f"{given!r} is the start of {len(matches)} session ids ({shown}); give more of it",
                       EXIT_USAGE)
    if matches:
        log.info("session %r is %s (the only id starting so, or the first of a fork family)", given, matches[0])
        return matches[0]
    return given


def resolve_session(settings: Settings, given: str) -> str:
    """:func:`resolve_session_id` over its own connection."""

    async def work(client: Client) -> str:
        return await resolve_session_id(client, given)

    return run(settings, work, verify_data_dir=False)


def resolve_session_callback(ctx: click.Context, param: click.Parameter, value: Any) -> Any:
    if value is None or ctx.resilient_parsing:
        return value
    return resolve_session(settings_of(ctx), value)


def session_option(*names: str, **kwargs: Any) -> Callable[..., Any]:
    """An option naming an existing session (prefixes and ``last`` resolved)."""
    return click.option(*names, callback=resolve_session_callback, **kwargs)


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
    them in ``--help`` (``sessions view`` for ``sessions show``, a name users of other CLIs type)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.aliases: dict[str, click.Command] = {}

    def alias(self, name: str, command: click.Command) -> None:
        self.aliases[name] = command

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        return super().get_command(ctx, cmd_name) or self.aliases.get(cmd_name)


class _InertFormatter(logging.Formatter):
    """Log lines go to the user's terminal and quote answers (stored content) and refusals:
    nothing in them may drive it (JSON escapes C0 controls, but not DEL or C1's CSI)."""

    def format(self, record: logging.LogRecord) -> str:
        from ctxd.cli.render import safe

        return safe(super().format(record))


def setup_logging(verbose: int) -> None:
    """``-v``: what ctxd-cli does (configuration, daemon, each request and its time) on
    stderr; ``-vv``/``--debug``: every request and answer too, and tracebacks."""
    if verbose <= 0:
        return
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(_InertFormatter("ctxd-cli: %(message)s"))
    for name in ("ctxd.cli", "ctxd.client"):
        logger = logging.getLogger(name)
        logger.handlers[:] = [handler]
        logger.setLevel(logging.DEBUG if verbose >= 2 else logging.INFO)
        logger.propagate = False


def _port(ctx: click.Context, param: click.Parameter, value: int | None) -> int | None:
    if value is not None and not 1 <= value <= 65535:
        raise click.BadParameter(f"{value} is not a port number (1-65535)")
    return value


@click.group(cls=CtxdGroup, epilog=EPILOG, context_settings={"help_option_names": ["-h", "--help"]})
@click.option("--socket", metavar="PATH", help="The daemon's Unix socket (default: from the configuration).")
@click.option("--tcp", type=int, metavar="PORT", callback=_port,
              help="Talk to a daemon serving TCP on 127.0.0.1:PORT (ctxd --tcp PORT) instead, with the token in "
                   "daemon.token_file; never starts one.")
@click.option("--token-file", metavar="FILE", help="The TCP token file (default: daemon.token_file).")
@click.option("--data-dir", metavar="DIR", help="Data directory for a daemon ctxd-cli starts (and the one expected).")
@click.option("--config", "config_file", metavar="FILE",
              help="Configuration file (default ~/.config/ctxd/config.toml).")
@click.option("--no-autostart", is_flag=True, help="Fail (exit 3) instead of starting a daemon when none answers.")
@click.option("--json", "json_", is_flag=True, help="Print machine-readable JSON (and nothing else) on stdout; "
              "errors too, as {\"error\": ...}.")
@click.option("-v", "--verbose", count=True, help="Say what ctxd-cli does on stderr: configuration, daemon, "
              "each request and its time (-vv: the requests and answers too).")
@click.option("--debug", is_flag=True, help="The same as -vv, and a traceback with an unexpected error.")
@click.version_option(package_name="ctxd", prog_name="ctxd-cli", message="%(prog)s %(version)s")
@click.pass_context
def cli(ctx: click.Context, socket: str | None, tcp: int | None, token_file: str | None, data_dir: str | None,
        config_file: str | None, no_autostart: bool, json_: bool, verbose: int, debug: bool) -> None:
    """Talk to the ctxd context daemon: sessions, history, search, compression,
    snapshots, goals, live watching; and check its database (doctor)."""
    global _json_requested
    settings = settings_of(ctx)
    settings.socket = socket
    settings.tcp = tcp
    settings.token_file = token_file
    settings.data_dir = data_dir
    settings.config_file = config_file
    settings.autostart = not no_autostart
    settings.json = settings.json or json_
    settings.verbose = 2 if debug else verbose
    _json_requested = _json_requested or json_
    setup_logging(settings.verbose)


def _json_error(exc: click.ClickException) -> dict[str, Any]:
    error: dict[str, Any] = {"message": exc.format_message(), "exitCode": exc.exit_code}
    if isinstance(exc, CliError):
        if exc.code is not None:
            error["code"] = exc.code
        if exc.data is not None:
            error["data"] = exc.data
    return {"error": error}


def main(argv: list[str] | None = None) -> int:
    """Console-script entry point."""
    global _json_requested
    os.umask(0o077)  # exports (and a daemon's log, when it starts one) are for this user only
    args = list(sys.argv[1:] if argv is None else argv)
    _json_requested = False
    try:
        result = cli.main(args=args, prog_name="ctxd-cli", complete_var="_CTXD_CLI_COMPLETE",
                          standalone_mode=False)
    except SystemExit as exc:  # shell completion exits by itself
        return exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
    except click.ClickException as exc:
        if _json_requested or "--json" in args:
            from ctxd.cli.render import JSON_UNSAFE  # (a message may quote a C1 control)

            click.echo(JSON_UNSAFE.sub(lambda m: f"\\u{ord(m.group()):04x}",
                                       json.dumps(_json_error(exc), ensure_ascii=False)))
        exc.show()
        return exc.exit_code
    except click.Abort:
        click.echo("Aborted!", err=True)
        return 1
    except Exception as exc:  # a bug: still one line, unless --debug asks for the traceback
        if "--debug" in args or "-vv" in args:
            import traceback

            traceback.print_exc()
        if _json_requested or "--json" in args:
            click.echo(json.dumps({"error": {"message": f"unexpected {type(exc).__name__}: {exc}",
                                             "exitCode": EXIT_REFUSED}}))
        click.echo(f"error: unexpected {type(exc).__name__}: {exc} (ctxd-cli --debug shows where)", err=True)
        return EXIT_REFUSED
    return result if isinstance(result, int) else EXIT_OK


def _register() -> None:
    from ctxd.cli import (
        context,
        daemon,
        doctor,
        history,
        info,
        migrate,
        prompt,
        push,
        replay,
        sessions,
        snapshots,
        stats,
        transfer,
        watch,
    )

    for command in (sessions.sessions, push.push, prompt.prompt, stats.stats, history.history, history.search,
                    context.compress, context.checkpoints, context.expand, context.pin, context.goal,
                    snapshots.snapshot, transfer.export, transfer.import_, replay.replay, watch.watch,
                    doctor.doctor, migrate.migrate, daemon.daemon, info.config, info.paths, daemon.completion):
        cli.add_command(command)


if __name__ == "__main__":
    # Run the importable copy of this module, the one the command modules register on.
    from ctxd.cli.main import main as _main

    sys.exit(_main())
