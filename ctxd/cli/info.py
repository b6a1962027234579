"""``ctxd-cli config`` and ``ctxd-cli paths``: what ctxd-cli would use, and where from.

Neither talks to a daemon: they show the configuration ctxd-cli reads (and a daemon it
starts would read) — a daemon already running keeps the settings it started with.
"""

from __future__ import annotations

import os
import tomllib
from pathlib import Path
from typing import Any, get_type_hints

import click
import msgspec

from ctxd.cli import render
from ctxd.cli.main import Settings, json_option, settings_of
from ctxd.config import Config, default_config_file, env_overrides


def config_file_of(settings: Settings) -> tuple[Path, str]:
    """The configuration file and why that one: ``--config``, ``CTXD_CONFIG`` or the default."""
    if settings.config_file:
        return Path(settings.config_file).expanduser(), "--config"
    if os.environ.get("CTXD_CONFIG"):
        return Path(os.environ["CTXD_CONFIG"]).expanduser(), "CTXD_CONFIG"
    return default_config_file(), "default"


def _file_data(path: Path) -> dict[str, Any]:
    try:
        return tomllib.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError):
        return {}  # (settings.config has already refused a file it cannot read)


def effective(settings: Settings) -> list[dict[str, Any]]:
    """Every key with its effective value and where the value came from: ``flag``
    (a ctxd-cli option), ``env`` (``CTXD_<SECTION>_<KEY>``), ``file`` or ``default``."""
    config: Config = settings.config  # first: a bad file or value is refused here, naming it
    path, _ = config_file_of(settings)
    layers = [("flag", settings.overrides()), ("env", env_overrides()), ("file", _file_data(path))]
    out = []
    for section, section_type in get_type_hints(Config).items():
        values = getattr(config, section)
        for key in get_type_hints(section_type):
            source = next((name for name, data in layers if key in (data.get(section) or {})), "default")
            entry: dict[str, Any] = {"key": f"{section}.{key}", "value": msgspec.to_builtins(getattr(values, key)),
                                     "source": source}
            if source == "env":
                entry["variable"] = f"CTXD_{section}_{key}".upper()
            elif source == "file":
                entry["file"] = str(path)
            out.append(entry)
    return out


def _shown(value: Any) -> str:
    if isinstance(value, str):
        return f'"{value}"'
    return msgspec.json.encode(value).decode()


@click.command("config")
@click.option("--changed", is_flag=True, help="Only the keys that are not at their default.")
@json_option
@click.pass_context
def config(ctx: click.Context, changed: bool) -> None:
    """The effective settings and where each comes from: default, file, env
    (CTXD_<SECTION>_<KEY>) or flag. Never contacts the daemon.

    These are the settings ctxd-cli uses and a daemon it starts would use; a daemon
    already running keeps those it started with. Every key is described in
    docs/configuration.md.
    """
    settings = settings_of(ctx)
    entries = effective(settings)
    path, why = config_file_of(settings)
    if changed:
        entries = [e for e in entries if e["source"] != "default"]
    if settings.json:
        render.print_json({"file": str(path), "fileExists": path.exists(), "fileFrom": why, "settings": entries})
        return
    state = "" if path.exists() else " (not found)"
    render.line(f"file: {path}{state}" + (f" (from {why})" if why != "default" else ""))
    render.line("precedence: default < file < env (CTXD_<SECTION>_<KEY>) < flag")
    render.table([render.Column("KEY"), render.Column("VALUE", flex=True), render.Column("FROM")],
                 ([e["key"], _shown(e["value"]), render.Styled(e["source"], "" if e["source"] == "default" else "cyan")]
                  for e in entries))
    if changed and not entries:
        render.line("every key is at its default")


def path_entries(settings: Settings) -> list[dict[str, Any]]:
    config = settings.config
    path, _ = config_file_of(settings)
    log = settings.log_path
    entries = [
        ("config", path, "configuration file (--config, CTXD_CONFIG)"),
        ("socket", settings.socket_path, "Unix socket ctxd-cli connects to (daemon.socket, --socket)"),
        ("data", config.data_dir, "data directory (daemon.data_dir, --data-dir)"),
        ("database", config.database_path, "the database, in the data directory"),
        ("log", log, "log of a daemon ctxd-cli starts (daemon.log_file, else daemon.log beside the socket)"),
        ("token", settings.token_path, "TCP token file (daemon.token_file, --token-file)"),
    ]
    return [{"name": name, "path": str(value), "exists": Path(value).exists(), "what": what}
            for name, value, what in entries]


@click.command("paths")
@json_option
@click.pass_context
def paths(ctx: click.Context) -> None:
    """Where ctxd's files are: configuration, socket, data, database, log, TCP token.
    Never contacts the daemon."""
    settings = settings_of(ctx)
    entries = path_entries(settings)
    if settings.json:
        render.print_json({e["name"]: {"path": e["path"], "exists": e["exists"]} for e in entries})
        return
    render.fields([(e["name"], e["path"] + ("" if e["exists"] else "  (not there yet)")) for e in entries])
