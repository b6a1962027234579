"""The wire: msgspec Structs for every params, result and notification.

These Structs are the single source of truth: the server decodes with them, the
client library encodes with them, and ``python -m ctxd.protocol.generate`` turns
them into ``protocol/schema.json`` and ``protocol/methods.md``.
"""
