"""Kombu's file-system transport, with messages that appear whole: the broker of `make run`.

kombu's own transport creates a message's file and then writes it; a consumer that lists the folder
in between takes the empty file, cannot parse it and its Celery worker exits (seen starting `make
run`'s stack: `JSONDecodeError: Expecting value`, the stack did not come up). Here a message is
written under a name no queue's consumer reads and renamed into place: a rename within one folder is
atomic, so a consumer finds the whole message or nothing. A consumer takes a message by renaming it
into the broker's own `processed` folder (kombu's moves it to the system's temporary folder, which may
be another file system: a copy, not a rename, that two consumers could both make).

Both planes use it (the control plane's Celery app and the worker's agent call `install()`): it takes
the `filesystem://` scheme in kombu's table of transports, so that scheme and no other resolves here
(a `broker_transport` setting would also take over any other URL a process connects to).
"""

from __future__ import annotations

import contextlib
import os
import uuid
from time import monotonic

from kombu.exceptions import ChannelError
from kombu.transport import filesystem
from kombu.utils.encoding import bytes_to_str, str_to_bytes
from kombu.utils.json import dumps, loads

TRANSPORT = "fsbroker:Transport"


class Channel(filesystem.Channel):
    def _put(self, queue, payload, **kwargs):  # noqa: ANN001, ANN202 - kombu's signature
        data = str_to_bytes(dumps(payload))
        # kombu's name (its consumers sort by it: the time first), written as a hidden part file first:
        # a consumer matches `<anything>.<queue>.msg` after the first dot, which a leading dot moves.
        name = f"{int(round(monotonic() * 1000))}_{uuid.uuid4()}.{queue}.msg"
        final = os.path.join(self.data_folder_out, name)
        part = os.path.join(self.data_folder_out, f".{name}.part")
        try:
            with open(part, "wb", buffering=0) as f:
                f.write(data)
            os.replace(part, final)
        except OSError as exc:
            with contextlib.suppress(OSError):
                os.remove(part)
            raise ChannelError(f"Cannot add file {final!r} to directory") from exc

    def _get(self, queue):  # noqa: ANN001, ANN202 - kombu's signature
        wanted = f"{queue}.msg"
        taken = self.processed_folder if os.path.isdir(self.processed_folder) else self.data_folder_in
        for name in sorted(os.listdir(self.data_folder_in)):
            if name.partition(".")[2] != wanted:
                continue
            mine = os.path.join(taken, f".taken-{uuid.uuid4().hex}-{name}")
            try:
                os.rename(os.path.join(self.data_folder_in, name), mine)  # atomic: one consumer gets it
            except OSError:
                continue  # another consumer took it first
            try:
                with open(mine, "rb") as f:
                    payload = f.read()
                if self.store_processed:
                    os.replace(mine, os.path.join(taken, name))
                else:
                    os.remove(mine)
            except OSError as exc:
                raise ChannelError(f"Cannot read file {mine!r} from queue.") from exc
            return loads(bytes_to_str(payload))
        raise filesystem.Empty()


class Transport(filesystem.Transport):
    Channel = Channel


def install() -> None:
    """`filesystem://` broker URLs use this transport in this process (idempotent)."""
    from kombu import transport

    transport.TRANSPORT_ALIASES["filesystem"] = TRANSPORT
    transport._transport_cache.pop("filesystem", None)  # resolved before: kombu's own class was cached
