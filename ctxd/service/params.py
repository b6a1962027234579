"""A request's params, from the plain data a client sent to the method's Struct: the one
validation every way into the service shares (the daemon's handlers, the service port
in process), so that the same bad input gets the same error, naming the field at fault."""

from __future__ import annotations

import re
from functools import cache
from typing import Any

import msgspec

from ctxd.formats.native import accept_native_names
from ctxd.protocol.errors import CtxdError, ErrorCode
from ctxd.protocol.methods import MethodSpec

_AT = re.compile(r" - at `\$\.?(.*)`$")
_MISSING = re.compile(r"^Object missing required field `([^`]+)`")

LSP_PARAMS = frozenset({"workDoneToken", "partialResultToken"})
"""Fields LSP lets any request carry; accepted (and ignored where unused) everywhere."""


@cache
def _param_names(params: type) -> frozenset[str]:
    return frozenset(f.encode_name for f in msgspec.structs.fields(params))


def decode_params(spec: MethodSpec, raw: Any) -> Any:
    """Params as the method's Struct, or a -32602 that names the field at fault."""
    if raw is None:
        if not spec.params_optional:
            raise CtxdError(ErrorCode.InvalidParams, f"Invalid params: {spec.name} requires params",
                            {"field": "params"})
        raw = {}
    if not isinstance(raw, dict):
        raise CtxdError(ErrorCode.InvalidParams,
                        f"Invalid params: {spec.name} takes an object, not {type(raw).__name__}",
                        {"field": "params"})
    if spec.name != "initialize":  # LSP clients send many initialize fields ctxd has no use for
        known = _param_names(spec.params)
        unknown = [k for k in raw if k not in known and k not in LSP_PARAMS]
        if unknown:
            raise CtxdError(ErrorCode.InvalidParams,
                            f"Invalid params: {spec.name} has no field {unknown[0]!r} "
                            f"(it takes {', '.join(sorted(known)) or 'no fields'})", {"field": unknown[0]})
    if spec.name == "session/push":
        accept_native_names(raw.get("messages"))
    elif spec.name == "context/prompt":
        accept_native_names(raw.get("push"))
    try:
        return msgspec.convert(raw, spec.params)
    except msgspec.ValidationError as exc:
        text = str(exc)
        match = _AT.search(text)
        field = match.group(1) if match else ""
        if match:
            text = text[: match.start()] + (f" (at params.{field})" if field else "")
        missing = _MISSING.match(text)
        if missing:  # point at the missing field itself
            field = f"{field}.{missing.group(1)}" if field else missing.group(1)
        raise CtxdError(ErrorCode.InvalidParams, f"Invalid params: {text}",
                        {"field": field or "params"}) from None
