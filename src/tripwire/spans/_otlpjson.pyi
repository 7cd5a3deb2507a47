from typing import Any

def scan(
    data: bytes, prefixes: tuple[bytes, ...], keys: frozenset[bytes], max_depth: int
) -> list[tuple[Any, ...]] | None: ...
