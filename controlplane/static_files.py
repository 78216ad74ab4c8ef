"""Static files (the admin's CSS/JS, Swagger UI and ReDoc) served by this process, with WhiteNoise.

WhiteNoise's own middleware is sync-only, and one sync-only middleware makes Django run the whole
stack adapted (tests/controlplane/test_middleware_async.py says why that hurts). The lookup is a
dict hit on a table built at start-up from STATIC_ROOT (`manage.py collectstatic`, which `make run`
and the image's build run), so the async path does the same work without a thread hop; only with
autorefresh (DEBUG) does a miss touch the disk, in a thread.
"""

from __future__ import annotations

from asgiref.sync import iscoroutinefunction, markcoroutinefunction, sync_to_async
from whitenoise.middleware import WhiteNoiseMiddleware


class AsyncWhiteNoiseMiddleware(WhiteNoiseMiddleware):
    sync_capable = True
    async_capable = True

    def __init__(self, get_response=None, **kwargs) -> None:
        super().__init__(get_response, **kwargs)
        self._is_async = iscoroutinefunction(get_response)
        if self._is_async:
            markcoroutinefunction(self)

    def __call__(self, request):
        if self._is_async:
            return self.__acall__(request)
        return super().__call__(request)

    async def __acall__(self, request):
        if self.autorefresh:
            static_file = await sync_to_async(self.find_file, thread_sensitive=False)(request.path_info)
        else:
            static_file = self.files.get(request.path_info)
        if static_file is not None:
            response = self.serve(static_file, request)
            # The file is read in a thread, in large chunks: Django's ASGI handler would otherwise
            # iterate the sync file itself, one 4 KiB thread hop per chunk (and warn about it).
            response.streaming_content = _read_in_thread(response.file_to_stream)
            return response
        return await self.get_response(request)


CHUNK_BYTES = 256 * 1024  # the admin's largest stylesheet and script fit in one read


async def _read_in_thread(file):
    if file is None:  # HEAD, 304: no body (the response closes the file it opened)
        return
    read = sync_to_async(file.read, thread_sensitive=False)
    while chunk := await read(CHUNK_BYTES):
        yield chunk
