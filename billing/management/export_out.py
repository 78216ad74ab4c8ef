"""Where the export commands write their rows: a file, or the command's standard output (Parquet only to
a pipe, never to a terminal)."""

from __future__ import annotations

from collections.abc import Iterable

from django.core.management.base import BaseCommand, CommandError

from billing import exports


def write_export(command: BaseCommand, columns, rows: Iterable[tuple], *, file_format: str,  # noqa: ANN001
                 out: str | None) -> None:
    if file_format == "csv":
        chunks = exports.csv_stream(columns, rows)
        if out:
            with open(out, "w", newline="", encoding="utf-8") as target:
                target.writelines(chunks)
        else:
            for chunk in chunks:
                command.stdout.write(chunk, ending="")
        return
    chunks = exports.parquet_stream(columns, rows)
    if out:
        with open(out, "wb") as target:
            target.writelines(chunks)
        return
    stream = command.stdout._out
    if stream.isatty():
        raise CommandError("refusing to write Parquet to a terminal; use --out FILE or a pipe")
    binary = getattr(stream, "buffer", stream)
    binary.writelines(chunks)
    binary.flush()
