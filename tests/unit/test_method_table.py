"""One table of method and notification names (``ctxd/protocol/methods.py``): handlers
register against it, notifications are named by their params Struct, and the names
clients and the CLI use are in it."""

from __future__ import annotations

import ast
import inspect
import re
from pathlib import Path

import msgspec
import pytest

from ctxd import protocol
from ctxd.protocol import methods
from ctxd.protocol.methods import METHODS, NOTIFICATION_METHODS, NOTIFICATIONS, notification_method
from ctxd.protocol.notifications import SessionUpdated
from ctxd.server.handlers import HANDLERS, handles
from ctxd.service.events import CollectingEvents, NullEvents

ROOT = Path(__file__).resolve().parents[2]
SENT = {name: spec for name, spec in NOTIFICATIONS.items() if spec.direction == "server->client"}


def _protocol_structs() -> dict[str, type]:
    import importlib
    import pkgutil

    found: dict[str, type] = {}
    for info in pkgutil.iter_modules(protocol.__path__):
        module = importlib.import_module(f"ctxd.protocol.{info.name}")
        for name, obj in vars(module).items():
            if inspect.isclass(obj) and issubclass(obj, msgspec.Struct) and obj.__module__ == module.__name__:
                found[name] = obj
    return found


def _emitted_structs() -> dict[str, list[str]]:
    """Struct name -> where it is sent: ``X.emit(session, Struct(...))`` and
    ``X.notify(Struct(...))`` calls in the service and the server."""
    sent: dict[str, list[str]] = {}
    for path in sorted([*ROOT.glob("ctxd/service/*.py"), *ROOT.glob("ctxd/server/**/*.py")]):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)):
                continue
            if node.func.attr == "emit" and len(node.args) == 2:
                arg = node.args[1]
            elif node.func.attr == "notify" and len(node.args) == 1:
                arg = node.args[0]
            else:
                continue
            assert isinstance(arg, ast.Call), f"{path.name}:{node.lineno}: emit/notify a Struct built in place"
            name = arg.func.attr if isinstance(arg.func, ast.Attribute) else arg.func.id  # type: ignore[union-attr]
            sent.setdefault(name, []).append(f"{path.relative_to(ROOT)}:{node.lineno}")
    return sent


def test_every_notification_struct_has_exactly_one_method() -> None:
    # Each notification the daemon sends has a Struct of its own, and the mapping is whole.
    assert sorted(NOTIFICATION_METHODS.values()) == sorted(SENT)
    assert len(set(NOTIFICATION_METHODS)) == len(SENT)
    for name, spec in SENT.items():
        assert NOTIFICATION_METHODS[spec.params] == name
    # Every Struct that looks like a notification's params is one.
    structs = _protocol_structs()
    named = {n for n in structs if n.endswith("Notification")} | {
        n for n, cls in structs.items() if cls.__module__ == "ctxd.protocol.notifications"}
    for name in named:
        assert structs[name] in NOTIFICATION_METHODS, f"{name} has no notification in ctxd.protocol.methods"


def test_what_the_service_and_server_send_is_in_the_table_and_everything_in_it_is_sent() -> None:
    sent = _emitted_structs()
    structs = _protocol_structs()
    for name, where in sent.items():
        assert name in structs and structs[name] in NOTIFICATION_METHODS, \
            f"{name} is sent ({', '.join(where)}) but is not a notification's params in ctxd.protocol.methods"
    by_method = {NOTIFICATION_METHODS[structs[n]] for n in sent}
    assert by_method == set(SENT), f"in the table but never sent: {sorted(set(SENT) - by_method)}"


def test_a_struct_given_to_two_notifications_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(methods, "NOTIFICATIONS", dict(NOTIFICATIONS))
    monkeypatch.setattr(methods, "NOTIFICATION_METHODS", dict(NOTIFICATION_METHODS))
    with pytest.raises(TypeError, match="SessionUpdated is the params of both session/updated and session/other"):
        methods.notification("session/other", SessionUpdated, "a second name for the same Struct")


def test_a_sink_refuses_what_is_not_a_notification() -> None:
    for sink in (NullEvents(), CollectingEvents()):
        with pytest.raises(TypeError, match="not the params of a notification"):
            sink.emit("s", {"sessionId": "s"})
    with pytest.raises(TypeError):
        notification_method("session/updated")


def test_collected_events_carry_their_method() -> None:
    events = CollectingEvents()
    update = SessionUpdated(session_id="s", reason="push", last_seq=1, message_count=1, token_count=5,
                            context_tokens=8, pushed=1)
    events.emit("s", update)
    assert events.events == [("s", "session/updated", update)]
    assert events.of("session/updated") == events.of(SessionUpdated) == [update]
    assert events.of(SessionUpdated, session_id="other") == []
    assert events.methods("s") == ["session/updated"]


def test_handlers_and_methods_are_the_same_set() -> None:
    assert set(HANDLERS) == set(METHODS)
    with pytest.raises(KeyError, match="not in ctxd.protocol.methods"):
        handles("session/teleport")


# Names the client side uses that are its own, not the daemon's.
CLIENT_LOCAL = {
    "$/error": "ctxd/client.py hands a server error without an id to its callbacks under this name",
}
_NAME = re.compile(r"^(\$|session|context|checkpoint|snapshot|goal|daemon|history|message)/[A-Za-z]+$")


def _client_side_files() -> list[Path]:
    files = [ROOT / "ctxd" / "client.py", *sorted((ROOT / "ctxd" / "cli").glob("*.py"))]
    for extra in ("ctxd/mcp", "clients/python"):
        files += sorted((ROOT / extra).glob("**/*.py"))
    return [f for f in files if f.exists()]


def test_method_names_used_by_clients_and_the_cli_are_in_the_table() -> None:
    known = set(METHODS) | set(NOTIFICATIONS) | set(CLIENT_LOCAL)
    unknown: list[str] = []
    for path in _client_side_files():
        try:
            tree = ast.parse(path.read_text(encoding="utf-8"))
        except SyntaxError:  # (a file mid-edit elsewhere: not this test's subject)
            continue
        for node in ast.walk(tree):
            if isinstance(node, ast.Constant) and isinstance(node.value, str) and _NAME.match(node.value):
                if node.value not in known:
                    unknown.append(f"{path.relative_to(ROOT)}:{node.lineno}: {node.value!r}")
    assert not unknown, "method names that are not in ctxd.protocol.methods:\n" + "\n".join(unknown)
