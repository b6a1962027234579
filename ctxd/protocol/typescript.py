"""TypeScript types of the protocol, rendered from ``protocol/schema.json``.

The VS Code extension (``clients/vscode/src/protocol/types.ts``) imports these instead of
types written by hand, so a field added, renamed or made optional in a Struct reaches the
extension's type-check through ``python -m ctxd.protocol.generate`` (and a test fails when
the file is stale). Every ``$defs`` entry becomes an interface (objects) or a type (unions);
the names below that are not ``$defs`` (``Role``, ``Prompt``...) are taken from the field or
result that defines them, so they cannot drift either.
"""

from __future__ import annotations

import json
import re
from typing import Any

TYPES_PATH = "clients/vscode/src/protocol/types.ts"

# Types the schema inlines, named after the field (def, property) whose type they are; a
# field of exactly that type elsewhere is written with the name.
FIELD_ALIASES: dict[str, tuple[str, str]] = {
    "Role": ("Message", "role"),
    "PromptFormat": ("PromptParams", "format"),
    "ExportFormat": ("ExportParams", "format"),
    "CheckpointLevel": ("Checkpoint", "level"),
    "ReliabilityLevel": ("Reliability", "level"),
    "CompressionLayer": ("CompressResult", "layers[]"),
    "ContentBlock": ("Message", "content[]"),
    "WorkDoneProgress": ("ProgressParams", "value"),
}
# Named after a method's result.
RESULT_ALIASES: dict[str, str] = {"Prompt": "context/prompt"}

HEADER = """\
// Generated from protocol/schema.json by `python -m ctxd.protocol.generate`; do not edit
// (tests/unit/test_generated_docs.py fails when this file is stale).
"""


def _literal(value: Any) -> str:
    return json.dumps(value, ensure_ascii=False)


def _name(ref: str) -> str:
    return ref.rsplit("/", 1)[-1]


class _Renderer:
    def __init__(self, schema: dict[str, Any]) -> None:
        self.schema = schema
        self.defs: dict[str, Any] = schema["$defs"]
        self.aliases: dict[str, str] = {}  # type text -> alias name

    def type_of(self, node: Any, *, use_aliases: bool = True) -> str:
        text = self._type_of(node)
        if use_aliases and text in self.aliases:
            return self.aliases[text]
        return text

    def _type_of(self, node: Any) -> str:
        if node is True or node == {}:
            return "unknown"
        if "$ref" in node:
            return _name(node["$ref"])
        if "anyOf" in node:
            return " | ".join(self.type_of(sub) for sub in node["anyOf"])
        if "enum" in node:
            return " | ".join(_literal(v) for v in node["enum"])
        if "const" in node:
            return _literal(node["const"])
        kind = node.get("type")
        if isinstance(kind, list):
            return " | ".join(self.type_of({**node, "type": k}) for k in kind)
        if kind == "array":
            if "prefixItems" in node:
                return "[" + ", ".join(self.type_of(item) for item in node["prefixItems"]) + "]"
            item = self.type_of(node.get("items", {}))
            return f"({item})[]" if " " in item else f"{item}[]"
        if kind == "object":
            extra = node.get("additionalProperties")
            if isinstance(extra, dict) and extra:
                return f"Record<string, {self.type_of(extra)}>"
            return "Record<string, unknown>"
        if kind in ("integer", "number"):
            return "number"
        if kind in ("string", "boolean", "null"):
            return str(kind)
        return "unknown"

    def field_node(self, def_name: str, path: str) -> Any:
        prop, items = (path[:-2], True) if path.endswith("[]") else (path, False)
        node = self.defs[def_name]["properties"][prop]
        if items:  # the array's items (of ``T[] | null`` too)
            arrays = [node] if node.get("type") == "array" else \
                [sub for sub in node.get("anyOf", []) if sub.get("type") == "array"]
            node = arrays[0]["items"]
        return node

    def aliases_block(self) -> list[str]:
        out: list[str] = []
        for alias, (def_name, path) in FIELD_ALIASES.items():
            text = self.type_of(self.field_node(def_name, path), use_aliases=False)
            out.append(f"export type {alias} = {text};")
            self.aliases[text] = alias
        for alias, method in RESULT_ALIASES.items():
            out.append(f"export type {alias} = {self.type_of(self.schema['methods'][method]['result'])};")
        return out

    def definition(self, name: str, node: dict[str, Any]) -> list[str]:
        out = _doc(node.get("description"))
        props = node.get("properties")
        if node.get("type") == "object" and props is not None:
            required = set(node.get("required", []))
            if not props:
                return out + [f"export type {name} = Record<string, never>;"]
            out.append(f"export interface {name} {{")
            for field, sub in props.items():
                optional = "" if field in required else "?"
                out.append(f"  {_key(field)}{optional}: {self.type_of(sub)};")
            out.append("}")
            return out
        return out + [f"export type {name} = {self.type_of(node)};"]


def _key(field: str) -> str:
    return field if re.fullmatch(r"[A-Za-z_$][A-Za-z0-9_$]*", field) else _literal(field)


def _doc(text: str | None) -> list[str]:
    if not text:
        return []
    lines = text.replace("*/", "*\\/").splitlines()
    return ["/**", *[f" * {line}".rstrip() for line in lines], " */"]


def render_typescript(schema: dict[str, Any]) -> str:
    """The whole ``types.ts`` for ``schema`` (``build_schema()``'s value)."""
    r = _Renderer(schema)
    out = [HEADER.rstrip("\n"), "", "// --- named field types ---", "", *r.aliases_block(), "", "// --- types ---", ""]
    for name, node in r.defs.items():
        out += r.definition(name, node) + [""]
    notes = {method: r.type_of(n["params"]) for method, n in schema["notifications"].items()
             if n["direction"] == "server->client" and method != "$/progress"}
    out += ["// --- notifications (server -> client) ---", "",
            "/** Every session notification ctxd sends, by method. */",
            "export interface NotificationMap {",
            *[f"  {_literal(method)}: {params};" for method, params in notes.items()],
            "}",
            "export type NotificationMethod = keyof NotificationMap;",
            "export const NOTIFICATION_METHODS: readonly NotificationMethod[] = [",
            *[f"  {_literal(method)}," for method in notes],
            "];",
            "",
            "/** A notification as delivered to listeners: method and params together, discriminated by method. */",
            "export type CtxdNotification = {",
            "  [M in NotificationMethod]: { method: M; params: NotificationMap[M] };",
            "}[NotificationMethod];",
            "",
            "// --- methods ---",
            "",
            "/** Every request's params and result, by method. */",
            "export interface MethodMap {"]
    for method, m in schema["methods"].items():
        params = r.type_of(m["params"]) + (" | undefined" if m["paramsOptional"] else "")
        out.append(f"  {_literal(method)}: {{ params: {params}; result: {r.type_of(m['result'])} }};")
    out += ["}", "export type Method = keyof MethodMap;", "",
            "/** ctxd's error codes (protocol/methods.md, Errors). */",
            "export const ErrorCodes = {"]
    out += [f"  {name}: {e['code']}," for name, e in schema["errors"].items()]
    out += ["} as const;", ""]
    return "\n".join(out)
