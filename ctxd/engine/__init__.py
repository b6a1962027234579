"""The compression engine: pure decisions over plain data (no I/O, no asyncio).

Everything here is a function of its arguments, so it is tested directly and fast;
``ctxd.service`` does the I/O around it.
"""
