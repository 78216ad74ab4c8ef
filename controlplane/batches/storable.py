"""What a batch line may hold so that it can be stored as a `BatchLine` row, on any database.

PostgreSQL refuses U+0000 in `text` and `jsonb` (a `DataError` for the whole insert), although JSON
allows it as `\\u0000` and orjson parses it. A line is checked for it where it arrives (the upload,
400 naming the line) and again where it is copied into rows (validation fails the batch naming the
line), so that no file can leave a batch stuck in `validating`. Everything else a JSON line can hold
(orjson's parse) PostgreSQL's `jsonb` stores: non-finite numbers and lone surrogates are refused by
the parse, and one line is far below jsonb's 255 MB per value.
"""

from __future__ import annotations

NUL = "\x00"


def nul_at(value: object, path: str) -> str | None:
    """Where in `value` (a parsed JSON value found at `path`, "" for a whole line) a string or an
    object key holds U+0000, as a path such as `body.messages[0].content`; None when nowhere."""
    stack: list[tuple[object, str]] = [(value, path)]
    while stack:  # a loop, not recursion: a line may nest as deep as the parser allows
        item, where = stack.pop()
        if isinstance(item, str):
            if NUL in item:
                return where
        elif isinstance(item, dict):
            if any(NUL in key for key in item):
                return f"a key of {where}" if where else "a key of the line"
            # Reversed onto the stack, so that the first occurrence in the line is the one named.
            stack.extend(reversed([(child, f"{where}.{key}" if where else key) for key, child in item.items()]))
        elif isinstance(item, list):
            stack.extend(reversed([(child, f"{where}[{i}]") for i, child in enumerate(item)]))
    return None


def line_nul_at(raw: str, item: dict) -> str | None:
    """`nul_at` for one parsed line; its raw text first answers the common case for free (JSON can
    only carry U+0000 as an escape: a raw control character is not valid JSON)."""
    if "\\u0000" not in raw:
        return None
    return nul_at(item, "")
