"""``ctxd-cli sessions export|import`` (also ``ctxd-cli export|import``).

An export is written atomically: the document goes to a temporary file in the
target's directory, is flushed to disk, and only then renamed over the target, so
the file is either the old one or the complete new one, never half of either.
"""

from __future__ import annotations

import os
import sys
import tempfile
from pathlib import Path
from typing import Any

import click

from ctxd.cli import render
from ctxd.cli.main import (
    EXIT_REFUSED,
    EXIT_USAGE,
    CliError,
    bad_input,
    json_option,
    request,
    run,
    settings_of,
)
from ctxd.cli.sessions import session_argument, sessions
from ctxd.client import Client, RpcError
from ctxd.protocol.errors import ErrorCode
from ctxd.store.files import fsync_directory

EXPORT_FORMATS = ("json", "markdown", "jsonl")
SUFFIX_FORMATS = {".json": "json", ".jsonl": "jsonl", ".ndjson": "jsonl", ".md": "markdown",
                  ".markdown": "markdown"}
IMPORT_FORMATS = ("auto", "json", "jsonl", "markdown", "claude_code", "openai_chat", "aider", "mini_swe_agent",
                  "swe_agent", "openhands", "openhands_events", "locomo")


def format_for(path: str | None, given: str | None) -> str:
    """--format, else the file's suffix, else json."""
    if given:
        return given
    if path and path != "-":
        return SUFFIX_FORMATS.get(Path(path).suffix.lower(), "json")
    return "json"


def output_error(path: Path, exc: OSError) -> CliError:
    return CliError(f"cannot write {path}: {exc.strerror or exc}", EXIT_USAGE)


def check_writable(path: Path) -> None:
    """Fail early (exit 2, before asking the daemon anything) on an output path that cannot work."""
    if path.is_dir():
        raise CliError(f"{path} is a directory; give a file name (-o DIR/name.json)", EXIT_USAGE)
    parent = path.parent
    if not parent.is_dir():
        raise CliError(f"cannot write {path}: the directory {parent} does not exist", EXIT_USAGE)
    if not os.access(parent, os.W_OK | os.X_OK):
        raise CliError(f"cannot write {path}: the directory {parent} is not writable", EXIT_USAGE)


def write_atomically(path: Path, data: bytes) -> None:
    """Replace ``path`` with ``data`` all at once: temporary file in the same directory,
    fsync, rename, fsync of the directory. On any failure the temporary file is removed
    and ``path`` is as it was. An existing file keeps its permissions; a new one gets
    the usual ones (0666 less the umask)."""
    target = Path(os.path.realpath(path))  # through a symlink: replace the file it points to
    try:
        mode = target.stat().st_mode & 0o7777
    except FileNotFoundError:
        umask = os.umask(0)
        os.umask(umask)
        mode = 0o666 & ~umask
    fd, tmp = tempfile.mkstemp(dir=target.parent, prefix=f".{target.name}.", suffix=".part")
    try:
        with os.fdopen(fd, "wb") as f:
            os.fchmod(f.fileno(), mode)
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, target)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise
    fsync_directory(target.parent)


@click.command("export")
@session_argument
@click.option("-o", "--output", metavar="FILE", help="Where to write (- for stdout). Default: the session's "
              "title as a file name in the current directory (never overwritten).")
@click.option("--format", "fmt", type=click.Choice(EXPORT_FORMATS),
              help="json (everything: messages, checkpoints, goal, compressions), markdown (to read) or jsonl "
                   "(OpenAI chat lines). Default: from the file's suffix (.json, .md, .jsonl), else json.")
@json_option
@click.pass_context
def export(ctx: click.Context, session_id: str, output: str | None, fmt: str | None) -> None:
    """Write SESSION's whole history to a file (or stdout) that `import` reads back.

    \b
      ctxd-cli sessions export s1 -o s1.md
      ctxd-cli export s1 -o - --format jsonl | head
    """
    settings = settings_of(ctx)
    fmt = format_for(output, fmt)
    path: Path | None = None
    if output and output != "-":
        path = Path(output)
        check_writable(path)

    result = request(settings, "session/export", {"sessionId": session_id, "format": fmt})
    document: str = result["document"]
    if output == "-":
        if settings.json:
            render.print_json(result)
        else:
            if render.is_terminal():  # to read, not to save: nothing the terminal would act on
                document = render.safe(document)
            sys.stdout.write(document if document.endswith("\n") or not document else document + "\n")
            sys.stdout.flush()
        return
    explicit = path is not None
    if path is None:
        path = Path(result["filename"])
        if path.exists() or path.is_symlink():
            raise CliError(f"{path} already exists; give -o {path} to replace it, or another -o FILE", EXIT_USAGE)
    data = document.encode("utf-8")
    try:
        write_atomically(path, data)
    except OSError as exc:
        raise output_error(path, exc) from None
    if settings.json:
        render.print_json({"sessionId": result["sessionId"], "format": result["format"],
                           "mediaType": result["mediaType"], "file": str(path), "bytes": len(data),
                           "messageCount": result["messageCount"]})
        return
    render.line(f"exported {render.count(result['messageCount'], 'message')} of session {result['sessionId']} "
                f"to {path} ({result['format']}, {render.num(len(data))} bytes)")
    if not explicit:
        render.note("(named after the session's title; choose another name with -o FILE)")


def read_document(file: str) -> tuple[str, str]:
    """The file's text and the name used in messages (``-`` is stdin); exit 4 when unreadable."""
    from ctxd.cli.replay import read_source

    data, source = read_source(file)
    try:
        return data.decode("utf-8"), source
    except UnicodeDecodeError as exc:
        raise bad_input(f"{source}: not UTF-8 text ({exc.reason} at byte {exc.start})") from None


@click.command("import")
@click.argument("file", metavar="FILE")
@click.option("--format", "fmt", type=click.Choice(IMPORT_FORMATS),
              help="ctxd's own exports (json, jsonl, markdown) or a transcript format. Default: markdown for a "
                   ".md file (but aider's chat history), else decided from the content (auto).")
@click.option("--session", "session_id", metavar="ID", help="Id of the new session (default: the exported "
              "one's, or a new id; a file with several conversations gets new ids).")
@click.option("--title", metavar="T", help="Title of the new session.")
@json_option
@click.pass_context
def import_(ctx: click.Context, file: str, fmt: str | None, session_id: str | None, title: str | None) -> None:
    """Create a session from FILE (or - for stdin): a ctxd export, or any transcript
    ctxd reads (Claude Code JSONL, aider's .aider.chat.history.md, OpenAI chat,
    mini-swe-agent, SWE-agent, OpenHands, LoCoMo). All or nothing: a file that cannot be
    read stores nothing (exit 4).
    """
    settings = settings_of(ctx)
    document, source = read_document(file)
    if not document.strip():
        raise bad_input(f"{source}: the file is empty")
    from ctxd.importers.aider import looks_like_aider

    if fmt is None:
        markdown = Path(file).suffix.lower() in (".md", ".markdown")
        # (aider's .aider.chat.history.md is Markdown too: the daemon tells it from the content)
        fmt = "markdown" if markdown and not looks_like_aider(document[:65536].encode()) else "auto"
    elif fmt == "aider" and not looks_like_aider(document[:65536].encode()):
        raise bad_input(f"{source}: does not look like aider's chat history (no \"# aider chat started at\" "
                        "line)")
    params: dict[str, Any] = {"document": document, "format": fmt}
    if session_id is not None:
        params["sessionId"] = session_id
    if title is not None:
        params["title"] = title

    async def work(client: Client) -> Any:
        try:
            return await client.request("session/import", params)
        except RpcError as exc:
            if exc.code == ErrorCode.ImportFailed:
                raise bad_input(f"{source}: {exc.message}") from None
            if exc.code == ErrorCode.SessionExists:
                existing = (exc.data or {}).get("sessionId") if isinstance(exc.data, dict) else None
                raise CliError(f"{exc.message} ({exc.code}); import it under another id with --session ID"
                               + (f" (or delete {existing} first)" if existing else ""), EXIT_REFUSED) from None
            raise

    result = run(settings, work)
    if settings.json:
        render.print_json(result)
        return
    ids = result["sessionIds"]
    render.line(render.Styled(f"imported {render.count(result['messageCount'], 'message')} from {source} "
                              f"({result['format']}) into {'session' if len(ids) == 1 else 'sessions'} "
                              f"{', '.join(ids)}", "green"))
    warnings = result.get("warnings") or []
    for warning in warnings[:5]:
        render.note(f"warning: {warning}", style="yellow")
    if len(warnings) > 5:
        render.note(f"... and {len(warnings) - 5} more warnings (--json lists them all)", style="yellow")


sessions.add_command(export)
sessions.add_command(import_)
