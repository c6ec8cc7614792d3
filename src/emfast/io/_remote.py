"""Stores in object storage or on a web server (``s3://``, ``gs://``, ``http(s)://``), read-only, as a store of
keys (a chunk's or a metadata file's path below the store) and their bytes.

Every format reads its remote chunks and metadata through :class:`RemoteStore` where it reads local files
otherwise: the bytes come over the network, the chunk is decoded in the calling (producer) thread as a local one
is, so decoders run in parallel outside the GIL while the requests of several threads are in flight together.
zarr-python (for sharded zarr) gets a zarr store on the same URL with the same retries (:meth:`zarr_store`),
tensorstore (precomputed scales it reads) a kvstore spec (:meth:`kvstore_spec`).

The transfers go through fsspec (s3fs for S3, aiohttp for HTTP, gcsfs for Google Cloud Storage), the extra
``emfast[remote]``: one event loop thread per process does the network I/O of every thread. Credentials come as
these libraries find them: for S3 the ``AWS_*`` environment variables, ``~/.aws/credentials`` and
``~/.aws/config`` (botocore's chain), ``AWS_ENDPOINT_URL`` for an S3-compatible server; ``anon=True`` in
``storage_options`` reads a public bucket without credentials. ``storage_options`` are fsspec's (e.g.
``{"endpoint_url": "http://127.0.0.1:9000", "anon": True}``), plus emfast's own two: ``retries`` (attempts after
the first, default :data:`RETRIES`) and ``timeout`` (seconds per request, default :data:`TIMEOUT_S`).

Failures: a missing key is None (each format says what a missing chunk means); a transient failure (HTTP 5xx,
429 or 408, a reset or refused connection, a timeout, a truncated response) is tried again after an exponential
backoff; what still fails, and every other failure (403, a bad request), is a :class:`RemoteReadError` naming the
URL and the key. A read waits in short slices, so a thread whose loader closes (:func:`abandoned_when`) stops
waiting at once and its request is cancelled: closing never waits for the network. Closing a volume cancels the
reads its cache announced and did not take (:meth:`RemoteStore.abandon_announced`).
"""
from __future__ import annotations

import asyncio
import concurrent.futures
import email.utils
import hashlib
import itertools
import os
import posixpath
import random
import re
import threading
import time
from collections import OrderedDict
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Callable, Iterator, Optional
from urllib.parse import urlsplit

from .._checks import refusal
from ._rereads import ChunkDigests
from ._source import SCHEMES, add_transfer_time

#: Attempts after the first for a transient failure, and the first backoff (doubled each time, with jitter).
RETRIES = 5
BACKOFF_S = 0.1
MAX_BACKOFF_S = 5.0
#: The longest wait a server's ``Retry-After`` (a 429 or 503 that throttles) is granted before the next attempt.
MAX_RETRY_AFTER_S = 60.0
#: Seconds one request may take (connect, send, receive) before it counts as a transient failure.
TIMEOUT_S = 30.0
#: How often a waiting thread checks whether its loader closed.
_POLL_S = 0.05
#: Most reads announced (:meth:`RemoteStore.will_get`) and not yet taken; the oldest are dropped beyond it.
MAX_ANNOUNCED = 1024
#: HTTP statuses worth trying again.
_TRANSIENT_STATUS = {408, 429, 500, 502, 503, 504}
#: Most characters of a library's error message quoted in emfast's.
DESCRIBED_CHARS = 300
#: Where tensorstore's payloads begin, which it puts after its message: `` [http_response_body='...']`` (a server's
#: error page), `` [source locations='...']``, `` [tensorstore_spec='...']``; they are left out of emfast's.
_TENSORSTORE_PAYLOADS = re.compile(r" \[[a-z_ ]+='")
#: S3's error codes worth trying again (whatever the HTTP status that came with them).
_TRANSIENT_S3_CODES = ("SlowDown", "ServiceUnavailable", "InternalError", "RequestTimeout")
#: Held while a store starts its filesystem in a process it was not started in (:meth:`RemoteStore._here`); a new
#: one in a forked child, where a parent's thread may have held it at the fork.
_STARTING = threading.Lock()


def _new_starting_lock() -> None:
    global _STARTING
    _STARTING = threading.Lock()


os.register_at_fork(after_in_child=_new_starting_lock)
#: Requests a tensorstore box read may make one after another: a sharded volume's shard index, minishard index,
#: then the chunks (tensorstore has no timeout of its own: see :meth:`RemoteStore.wait_tensorstore`).
REQUESTS_IN_A_ROW = 3
#: tensorstore's status codes for a transfer that failed (as opposed to data it cannot decode).
_TENSORSTORE_TRANSFER_STATUSES = ("PERMISSION_DENIED", "UNAUTHENTICATED", "UNAVAILABLE", "DEADLINE_EXCEEDED",
                                  "ABORTED", "RESOURCE_EXHAUSTED")


class RemoteReadError(OSError):
    """A key of a remote store could not be read (after retries, where the failure was transient); the message
    names the URL and the key."""


class RemoteAccessDenied(RemoteReadError):
    """The server refused a key to these credentials (401, 403)."""


class CredentialsUnavailable(RemoteAccessDenied):
    """No usable credentials were found (none, an unknown profile, an SSO login expired): no request was sent."""


class ChunkChangedError(RemoteReadError):
    """A chunk read again (after the cache dropped it) came with other bytes than before: the store was written
    while it was read (see :mod:`emfast.io._rereads`)."""


#: The metadata files of the formats read remotely. S3 answers a missing key with 403, not 404, to a reader without
#: the s3:ListBucket permission: opening a store asks for the metadata of formats it is not, and a denied one is
#: taken as missing (and named if no format is found). A denied chunk stays an error.
METADATA_NAMES = frozenset({"zarr.json", ".zarray", ".zgroup", ".zattrs", ".zmetadata", "attributes.json", "info"})


class ReadAbandoned(RuntimeError):
    """A remote read given up because the thread's loader closed meanwhile (:func:`abandoned_when`)."""


def is_url(path) -> bool:
    """True for a string naming a remote store (``s3://``, ``gs://``, ``http://``, ``https://``)."""
    return isinstance(path, str) and urlsplit(path).scheme.lower() in SCHEMES and "://" in path


#: The oldest fsspec that resets its event loop in a forked child: with an older one a lazy remote volume read in a
#: forked process (a DataLoader worker) waited for ever on the parent's loop, which no thread runs there.
FSSPEC_AT_LEAST = (2025, 3, 2)


def remote_missing() -> Optional[str]:
    """Why remote stores cannot be read here, or None if they can."""
    try:
        import fsspec
        import aiohttp  # noqa: F401
    except ImportError as error:
        return f"reading remote stores needs fsspec and aiohttp ({error}); pip install 'emfast[remote]'"
    if _release(fsspec.__version__) < FSSPEC_AT_LEAST:
        return (f"reading remote stores needs fsspec {'.'.join(map(str, FSSPEC_AT_LEAST))} or later (this is "
                f"{fsspec.__version__}, whose forked processes, such as DataLoader workers, hang on a remote read); "
                "pip install -U 'emfast[remote]'")
    return None


def _release(version: str) -> tuple:
    """The leading numbers of a version string ("2025.3.2.post1" -> (2025, 3, 2))."""
    numbers = []
    for part in version.split(".")[:3]:
        digits = "".join(itertools.takewhile(str.isdigit, part))
        if not digits:
            break
        numbers.append(int(digits))
    return tuple(numbers)


_abandon = threading.local()


@contextmanager
def abandoned_when(closed: Callable[[], bool]):
    """Within it, a remote read of this thread gives up (:class:`ReadAbandoned`) as soon as ``closed()`` is true,
    instead of waiting for the network: producer threads enter it with their loader's "closed" test."""
    previous = getattr(_abandon, "closed", None)
    _abandon.closed = closed
    try:
        yield
    finally:
        _abandon.closed = previous


def _filesystem(protocol: str, options: dict, timeout: float, asynchronous: bool):
    """An fsspec filesystem for ``protocol`` with bounded timeouts, retrying nothing itself (emfast retries)."""
    reason = remote_missing()
    if reason is not None:
        raise ImportError(reason)
    import fsspec
    options = dict(options)
    if protocol == "s3":
        try:
            import s3fs  # noqa: F401
        except ImportError:
            raise ImportError("reading s3:// needs s3fs; pip install 'emfast[remote]'") from None
        config = {"connect_timeout": min(timeout, 10.0), "read_timeout": timeout, "retries": {"total_max_attempts": 1},
                  "max_pool_connections": 64,  # announced chunks are requested together
                  **options.pop("config_kwargs", {})}
        # max_concurrency 1: one GET per key, no HEAD first to split large objects into parallel ranges
        options = {"config_kwargs": config, "max_concurrency": 1, **options}
    elif protocol == "gcs":
        try:
            import gcsfs  # noqa: F401
        except ImportError:
            raise ImportError("reading gs:// needs gcsfs; pip install gcsfs") from None
    else:
        import aiohttp
        client = {"timeout": aiohttp.ClientTimeout(total=timeout, sock_connect=min(timeout, 10.0)),
                  **options.pop("client_kwargs", {})}
        options = {"client_kwargs": client, **options}
    fs = fsspec.filesystem(protocol, asynchronous=asynchronous, **options)
    if protocol in ("s3", "gcs"):
        fs.retries = 1  # s3fs and gcsfs retry some errors themselves, on top of emfast's backoff
    return fs


def _transient(error: BaseException) -> bool:
    """Whether ``error`` is worth another attempt: a 5xx/429/408, a connection or payload failure, a timeout, a
    response that could not be parsed."""
    if isinstance(error, (asyncio.TimeoutError, TimeoutError, ConnectionError)) or _parse_failure(error) is not None:
        return True
    status = getattr(error, "status", None)
    if isinstance(status, int):
        return status in _TRANSIENT_STATUS
    try:
        import aiohttp
    except ImportError:
        return False
    if isinstance(error, (aiohttp.ClientConnectionError, aiohttp.ClientPayloadError)):
        return True
    response = _s3_response(error)
    if response is not None:  # s3fs turns botocore's errors into OSErrors carrying only S3's message
        status = response.get("ResponseMetadata", {}).get("HTTPStatusCode")
        return status in _TRANSIENT_STATUS or response.get("Error", {}).get("Code") in _TRANSIENT_S3_CODES
    text = str(error)
    return any(code in text for code in _TRANSIENT_S3_CODES + ("Connection reset", "Could not connect",
                                                               "Read timeout"))


def _parse_failure(error: BaseException) -> Optional[BaseException]:
    """aiohttp's error for a response it could not parse (a bad status line or header) behind ``error``, among
    its causes and contexts (botocore's ``HTTPClientError`` carries aiohttp's error as its context, aiohttp's own
    as its cause), or None. aiohttp reports one as status 400, which the server never sent; the connection is
    dropped, so another attempt may succeed (a server whose body ran past its Content-Length left the rest where
    the next response's status line belongs)."""
    try:
        from aiohttp.http_exceptions import HttpProcessingError, PayloadEncodingError
    except ImportError:
        return None
    for _ in range(4):
        error = error.__cause__ or error.__context__
        if error is None or isinstance(error, PayloadEncodingError):  # a body cut short: described as such
            return None
        if isinstance(error, HttpProcessingError):
            return error
    return None


def _chain(error: Optional[BaseException]) -> Iterator[BaseException]:
    """``error`` and the first three errors behind it (its cause, else its context): the libraries wrap each
    other's errors (s3fs botocore's, botocore aiohttp's)."""
    for _ in range(4):
        if error is None:
            return
        yield error
        error = error.__cause__ or error.__context__


def _s3_response(error: BaseException) -> Optional[dict]:
    """The S3 response (botocore's ``ClientError.response``) behind ``error`` or one of its causes: s3fs raises an
    OSError (errno EREMOTEIO for a 500 InternalError, EBUSY for a 503 SlowDown) whose cause is botocore's error."""
    return next((link.response for link in _chain(error) if isinstance(getattr(link, "response", None), dict)),
                None)


#: botocore's errors for credentials it could not obtain (a failing credential_process, an SSO login expired, a
#: profile's source_profile missing): no request was sent.
_CREDENTIAL_FAILURES = ("CredentialRetrievalError", "SSOTokenLoadError", "UnauthorizedSSOTokenError",
                        "TokenRetrievalError", "SSOError", "RefreshWithMFAUnsupportedError")


def _no_credentials(error: BaseException) -> Optional[str]:
    """What to do where botocore found no usable credentials behind ``error`` (no request was sent), or None."""
    for link in _chain(error):
        kind = type(link).__name__
        if kind == "ProfileNotFound":
            return ("the AWS profile named by AWS_PROFILE or storage_options 'profile' is not in ~/.aws/config or "
                    "~/.aws/credentials")
        if kind in ("NoCredentialsError", "PartialCredentialsError"):
            return ("no S3 credentials were found: set AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY, a profile in "
                    "~/.aws/credentials (AWS_PROFILE), or storage_options 'key' and 'secret'; for a public bucket "
                    "pass storage_options={'anon': True}")
        if kind in _CREDENTIAL_FAILURES:
            return ("the S3 credentials of the profile in use could not be obtained (for an SSO profile, log in "
                    "again with aws sso login; check its credential_process in ~/.aws/config)")
    return None


def _timed_out(error: BaseException) -> bool:
    """Whether ``error`` is a request that got no answer in time (asyncio's, or botocore's read/connect timeout)."""
    return isinstance(error, (asyncio.TimeoutError, TimeoutError)) or \
        type(error).__name__ in ("ReadTimeoutError", "ConnectTimeoutError")


def _denied(error: BaseException) -> bool:
    return isinstance(error, PermissionError) or getattr(error, "status", None) in (401, 403)


@dataclass(frozen=True)
class RemoteStamp:
    """Where a remote volume was opened from, and a digest of its metadata then (see :class:`Stamp`).

    ``path`` is the store's URL; ``size`` the metadata's length and ``mtime_ns`` 0 (object stores have no
    modification time emfast relies on)."""

    path: str
    dataset: str
    size: int
    mtime_ns: int
    digest: str
    store: "RemoteStore" = field(compare=False)  # how to ask again: stamps of the same metadata are equal
    marker: str

    def unchanged(self) -> bool:
        """True if the metadata file still holds what it held when the volume was opened (one request)."""
        try:
            data = self.store.get(self.marker)
        except (RemoteReadError, ReadAbandoned):
            return False
        return data is not None and hashlib.sha256(data).hexdigest() == self.digest


class RemoteStore:
    """The keys of a remote store below ``url``, read-only.

    Parameters
    ----------
    url : str
        ``s3://bucket/path``, ``gs://bucket/path``, ``http(s)://host/path``.
    storage_options : dict, optional
        fsspec's options for the protocol (e.g. ``endpoint_url``, ``anon``, ``key``/``secret``), plus ``retries``
        and ``timeout`` (see the module's notes).
    """

    def __init__(self, url: str, storage_options: Optional[dict] = None) -> None:
        scheme = urlsplit(url).scheme.lower()
        if scheme not in SCHEMES:
            raise ValueError(f"{url}: not a remote store URL (s3://, gs://, http://, https://)")
        self.url = url.rstrip("/")
        self.storage_options = dict(storage_options or {})
        options = dict(self.storage_options)
        self.retries = _count(options.pop("retries", RETRIES), url)
        self.timeout = _seconds(options.pop("timeout", TIMEOUT_S), url)
        _check_common_options(options, url)
        self._protocol = SCHEMES[scheme]
        self._options = options
        self._start_here()
        # fsspec paths: "bucket/path" for object stores, the whole URL for HTTP
        self._root = self.url if self._protocol in ("http", "https") else self.url.split("://", 1)[1]

    def _start_here(self) -> None:
        """The filesystem, its event loop and the announced reads of this process: after a fork (a PyTorch worker),
        the parent's are unusable (fsspec refuses them, their requests never complete here). The process is
        recorded last: :meth:`_here` takes a store recorded as this process's as ready."""
        self._fs = _filesystem(self._protocol, self._options, self.timeout, asynchronous=False)
        self._announced: "OrderedDict[str, concurrent.futures.Future]" = OrderedDict()
        self._lock = threading.Lock()
        self._remembered = _Remembered()
        self._chunks_read = ChunkDigests()
        #: (path, RemoteAccessDenied) of the metadata files taken as missing (:meth:`denied_metadata`).
        self.denied: list = []
        self._pid = os.getpid()

    @contextmanager
    def remembering(self):
        """Within this, each key is requested once, by this store, the stores below it and its
        :meth:`zarr_store`: opening a volume reads its metadata files several times over (emfast's checks, then
        zarr-python probing each format's files), one round trip each. What is read stays remembered only
        until the block ends: metadata read later (a change of the store being looked for) is read again."""
        self._here()
        self._remembered.start()
        try:
            yield
        finally:
            self._remembered.stop()

    def _here(self) -> None:
        if self._pid != os.getpid():
            # one thread starts the store in this process, the others wait: a worker's producers read at once,
            # and one that took the store for started while another was replacing the parent's filesystem read
            # through the parent's ("This class is not fork-safe")
            with _STARTING:
                if self._pid != os.getpid():
                    self._start_here()

    def child(self, key: str) -> "RemoteStore":
        """The store below ``key`` (same options and connections)."""
        key = key.strip("/")
        if not key:
            return self
        child = object.__new__(RemoteStore)
        child.__dict__.update(self.__dict__)
        child.url, child._root = f"{self.url}/{key}", f"{self._root}/{key}"
        return child

    @property
    def name(self) -> str:
        """The last part of the URL's path (as :attr:`pathlib.Path.name`)."""
        return self.url.rsplit("/", 1)[-1]

    def __truediv__(self, key) -> "RemoteStore":
        return self.child(str(key))

    def __str__(self) -> str:
        return self.url

    def __reduce__(self):
        return RemoteStore, (self.url, self.storage_options)

    def where(self, key: str) -> str:
        return f"{self.url}/{key}" if key else self.url

    def get(self, key: str) -> Optional[bytes]:
        """The bytes of ``key``, or None if the store has no such key.

        Raises
        ------
        RemoteReadError
            Access denied, or a failure still there after the retries; naming the URL and the key.
        ReadAbandoned
            The thread's loader closed while the read waited.
        """
        self._here()
        path = f"{self._root}/{key}" if key else self._root
        known, data = self._remembered.get(path)
        if known:
            return data
        start = time.perf_counter()
        with self._lock:
            future = self._announced.pop(path, None)
        try:
            if future is None:
                future = asyncio.run_coroutine_threadsafe(self._read(path, key), self._fs.loop)
            data = _wait(future)
        finally:
            add_transfer_time(time.perf_counter() - start)
        data = None if served_page(key, data) else data
        self._remembered.put(path, data)
        self.check_unchanged(key, path, data)
        return data

    def check_unchanged(self, key: str, path: str, data) -> None:
        """Raise ChunkChangedError if the chunk ``key`` (at ``path``, which names a byte range too where only
        that was read) was read before with other bytes than ``data`` (None: the store had no such key).
        Metadata files are read again on purpose (to see whether the store changed) and not checked here."""
        if posixpath.basename(key) in METADATA_NAMES:
            return
        change = self._chunks_read.changed(path, data)
        if change is not None:
            raise ChunkChangedError(f"{self.where(key)}: changed while emfast read the store ({change}): it is being "
                                    "written, and batches would mix its old and new contents; read a copy that "
                                    "nothing writes to meanwhile")

    def will_get(self, keys) -> None:
        """Start reading ``keys`` now, all at once; :meth:`get` then takes each one's bytes (or its error). A
        cache about to read several chunks announces them, so that it waits for one round trip, not one each."""
        self._here()
        with self._lock:
            for key in keys:
                path = f"{self._root}/{key}"
                if path not in self._announced:
                    self._announced[path] = asyncio.run_coroutine_threadsafe(self._read(path, key), self._fs.loop)
            while len(self._announced) > MAX_ANNOUNCED:  # announced and never taken (another thread read them)
                self._announced.popitem(last=False)[1].cancel()

    def abandon_announced(self) -> None:
        """Cancel the reads announced and not yet taken (the volume closed): their requests and retries end now,
        not minutes later against a server that does not answer."""
        with self._lock:  # cleared in place: the stores below this one share it (their reads are asked again)
            announced = list(self._announced.values())
            self._announced.clear()
        for future in announced:
            future.cancel()

    def exists(self, key: str) -> bool:
        """Whether the store has ``key`` (a HEAD request, no transfer of its bytes)."""
        self._here()
        path = f"{self._root}/{key}" if key else self._root
        return _wait(asyncio.run_coroutine_threadsafe(self._attempts(key, lambda: self._fs._exists(path)),
                                                      self._fs.loop))

    async def _read(self, path: str, key: str) -> Optional[bytes]:
        try:
            return await self._attempts(key, lambda: self._fs._cat_file(path))
        except FileNotFoundError:
            return None
        except RemoteAccessDenied as error:
            return self.denied_metadata(key, error)

    def denied_metadata(self, key: str, error: RemoteAccessDenied) -> None:
        """None (missing) for a metadata file the server denies (see :data:`METADATA_NAMES`), noted for
        :meth:`refuse_denied`; ``error`` raised again for any other key."""
        if posixpath.basename(key) not in METADATA_NAMES or isinstance(error, CredentialsUnavailable):
            raise error
        self.denied.append((f"{self._root}/{key}", error))
        return None

    def refuse_denied(self, error: BaseException) -> None:
        """Raise a RemoteAccessDenied, from ``error`` (no volume found), if metadata files were denied meanwhile:
        wrong credentials, rather than no such volume."""
        if self.denied:
            raise RemoteAccessDenied(f"{self.denied[0][1]} (no volume found where the server denied its metadata; "
                                     f"{len(self.denied)} denied)") from error

    def refuse_denied_attributes(self, keys) -> None:
        """Raise the RemoteAccessDenied of a metadata file among ``keys`` (below this store) taken as missing: the
        attributes that place a volume (a zarr v2 array's .zattrs) cannot be told missing from denied, and read as
        absent they would silently drop its resolution and offset."""
        wanted = {f"{self._root}/{key}" for key in keys}
        for path, error in self.denied:
            if path in wanted:
                raise RemoteAccessDenied(f"{error}: the attributes that place the volume (resolution, offset) may be "
                                         "there; S3 denies a missing key to a reader without s3:ListBucket, so "
                                         "grant it to read a volume without them") from error

    async def _attempts(self, key: str, request):
        return await retrying(request, self.retries, self.where(key), self.timeout, bool(self._options))

    def zarr_store(self):
        """A read-only zarr-python store of the same URL whose reads retry as :meth:`get` does."""
        from zarr.storage import FsspecStore

        store_retries, where, remembered, root, outer = self.retries, self.where, self._remembered, self._root, self

        class RetryingStore(FsspecStore):
            async def get(self, key, prototype, byte_range=None):
                path = f"{root}/{key}"
                known, data = remembered.get(path) if byte_range is None else (False, None)
                if known:
                    return None if data is None else prototype.buffer.from_bytes(data)
                try:
                    buffer = await retrying(lambda: FsspecStore.get(self, key, prototype, byte_range),
                                            store_retries, where(key), outer.timeout, bool(outer._options))
                except FileNotFoundError:  # a missing key (no allowed exception: a NoSuchBucket is raised)
                    buffer = None
                except RemoteAccessDenied as error:
                    buffer = outer.denied_metadata(key, error)
                if buffer is not None and byte_range is None and served_page(key, buffer.as_numpy_array()[:64]):
                    buffer = None
                if buffer is not None and byte_range is not None:
                    _check_range(byte_range, len(buffer), where(key))
                if byte_range is None and remembered.active:  # a copy of the bytes only for the open's memo
                    remembered.put(path, None if buffer is None else buffer.to_bytes())
                outer.check_unchanged(key, path if byte_range is None else f"{path} {byte_range}",
                                      None if buffer is None else buffer.as_numpy_array())
                return buffer

        fs = _filesystem(self._protocol, self._options, self.timeout, asynchronous=True)
        return RetryingStore(fs, read_only=True, path=self._root,
                             allowed_exceptions=(IsADirectoryError, NotADirectoryError))

    def kvstore_spec(self) -> dict:
        """The tensorstore kvstore of this URL, retrying as :meth:`get` does (tensorstore has no timeout per
        request: :meth:`wait_tensorstore` bounds the wait)."""
        parts = urlsplit(self.url)
        kind = {"http": "http", "https": "http"}.get(self._protocol, self._protocol)
        # tensorstore counts the attempts ("All 1 retry attempts failed" for max_retries 1)
        retries = {f"{kind}_request_retries": {"max_retries": self.retries + 1, "initial_delay": f"{BACKOFF_S}s",
                                                "max_delay": f"{MAX_BACKOFF_S}s"}}
        if kind == "http":
            return {"driver": "http", "base_url": self.url + "/", "context": retries}
        if kind == "gcs":
            return {"driver": "gcs", "bucket": parts.netloc, "path": parts.path.strip("/") + "/", "context": retries}
        spec = {"driver": "s3", "bucket": parts.netloc, "path": parts.path.strip("/") + "/", "context": retries}
        endpoint = (self._options.get("endpoint_url") or self._options.get("client_kwargs", {}).get("endpoint_url")
                    or os.environ.get("AWS_ENDPOINT_URL_S3") or os.environ.get("AWS_ENDPOINT_URL"))
        if endpoint:
            spec["endpoint"] = endpoint
        if self._options.get("anon"):
            spec["aws_credentials"] = {"type": "anonymous"}
        if self._options.get("requester_pays"):  # s3fs's option (tensorstore sends it under another header name)
            spec["requester_pays"] = True
        region = self._options.get("client_kwargs", {}).get("region_name")
        if region:
            spec["aws_region"] = region
        return spec

    def wait_tensorstore(self, future, where: str):
        """The result of a tensorstore read of this store, waited for as :meth:`get` waits (abandoned when the
        thread's loader closes) and for at most as long as :data:`REQUESTS_IN_A_ROW` requests one after another
        may take, each with :attr:`retries` retries of :attr:`timeout` seconds and their backoffs; RemoteReadError
        naming ``where`` for a failure of the transfer (denied, not reachable, out of time), the error as it is for
        any other (the caller names a chunk it cannot decode)."""
        one = (self.retries + 1) * self.timeout + sum(min(MAX_BACKOFF_S, BACKOFF_S * 2 ** n)
                                                      for n in range(self.retries))
        limit = REQUESTS_IN_A_ROW * one
        try:
            return _wait(future, time.monotonic() + limit)
        except TimeoutError:
            future.cancel()
            raise RemoteReadError(f"{where}: cannot read it: no answer within {limit:.0f} s ({REQUESTS_IN_A_ROW} "
                                  f"requests in a row, each with {self.retries} retries of {self.timeout:g} s)") \
                from None
        except Exception as error:
            failed = self.tensorstore_failure(error, where)
            if failed is not None:
                raise failed from error
            raise

    def tensorstore_failure(self, error: BaseException, where: str) -> Optional[RemoteReadError]:
        """The RemoteReadError naming ``where`` of a tensorstore error that is a failed transfer (denied, not
        reachable, out of time), None for any other. A denial says where tensorstore takes S3 credentials from:
        not from storage_options, and ~/.aws only through its own reading of the profile."""
        text = str(error)
        redirected = re.search(r"HTTP code (30[1-8])\b", text)
        if redirected:  # tensorstore's http kvstore does not follow them (fsspec's readers do)
            return RemoteReadError(f"{where}: the server redirected the request (HTTP {redirected.group(1)}), and "
                                   "tensorstore, which reads this volume, does not follow redirects: open the URL "
                                   f"it redirects to ({describe_error(error)})")
        if "was ignored by server" in text:  # a byte range answered with the whole object
            return RemoteReadError(f"{where}: the server ignores HTTP Range requests, which reading a sharded "
                                   "volume needs; serve the store from one that honours them (object stores and "
                                   f"common web servers do) ({describe_error(error)})")
        if not any(status in text for status in _TENSORSTORE_TRANSFER_STATUSES):
            return None
        if "PERMISSION_DENIED" in text or "UNAUTHENTICATED" in text:
            hint = ""
            if self._protocol == "s3" and self._options.get("requester_pays"):
                hint = (" (tensorstore, which reads it, sends the requester-pays header as x-amz-requester-payer, "
                        "which S3 does not read: a requester-pays bucket's scales cannot be read through it; copy "
                        "the volume to a bucket of your own)")
            elif self._protocol == "s3" and self._options.get("anon"):
                hint = " (anonymously, as storage_options asked: the bucket allows no public reads)"
            elif self._protocol == "s3":
                profile = self._options.get("profile") or os.environ.get("AWS_PROFILE")
                unused = f", and may not use the profile {profile!r}: export its keys as those variables" if profile \
                    else ""
                hint = (" (tensorstore reads it: it takes S3 credentials from the AWS_ACCESS_KEY_ID and "
                        "AWS_SECRET_ACCESS_KEY environment variables or an instance role, not from storage_options"
                        f"{unused})")
            return RemoteAccessDenied(f"{where}: access denied{hint} ({describe_error(error)})")
        return RemoteReadError(f"{where}: cannot read it ({describe_error(error)})")

    def stamp(self, dataset: str, marker: str) -> RemoteStamp:
        """The stamp of the volume ``dataset`` whose metadata file is ``marker`` (a key)."""
        data = self.get(marker) or b""
        return RemoteStamp(self.url, dataset, len(data), 0, hashlib.sha256(data).hexdigest(), self, marker)


class _Remembered:
    """The keys read while a store is :meth:`~RemoteStore.remembering`: one object shared by the store, the stores
    below it and its zarr store; empty, and remembering nothing, outside."""

    def __init__(self) -> None:
        self._data: Optional[dict] = None
        self._lock = threading.Lock()  # zarr-python reads on its event loop's thread

    def start(self) -> None:
        with self._lock:
            self._data = {}

    def stop(self) -> None:
        with self._lock:
            self._data = None

    @property
    def active(self) -> bool:
        return self._data is not None

    def get(self, path: str):
        """(whether ``path`` was read, its bytes or None if the store has no such key)."""
        with self._lock:
            if self._data is None or path not in self._data:
                return False, None
            return True, self._data[path]

    def put(self, path: str, data: Optional[bytes]) -> None:
        with self._lock:
            if self._data is not None:
                self._data[path] = data


def served_page(key: str, data) -> bool:
    """Whether ``data``, the bytes that came for the metadata file ``key``, is a web page: a static host that
    answers a missing file with a page and status 200 made emfast's probe for ``zarr.json`` fail as malformed
    metadata on a zarr v2 or precomputed store. Such a file counts as missing."""
    return data is not None and posixpath.basename(key) in METADATA_NAMES and bytes(data[:64]).lstrip()[:1] == b"<"


def _check_range(byte_range, size: int, where: str) -> None:
    """RemoteReadError where a byte-range request (zarr's inner chunk or shard index) got more bytes than it asked
    for: the server ignored the Range header (HTTP allows that) and sent the whole object, whose first bytes zarr
    would take for the chunk and report as a corrupt store."""
    asked = byte_range.end - byte_range.start if hasattr(byte_range, "end") else getattr(byte_range, "suffix", None)
    if asked is not None and size > asked:
        raise RemoteReadError(f"{where}: {size} bytes came for a request of {asked} (a byte range): the server "
                              "ignores HTTP Range requests, which reading a sharded array needs; serve the store "
                              "from one that honours them (object stores and common web servers do)")


async def retrying(request, retries: int, where: str, timeout: Optional[float] = None, options: bool = False):
    """``await request()``, again after a backoff while it fails transiently, at most ``retries`` times more;
    after a throttling answer's ``Retry-After`` (up to :data:`MAX_RETRY_AFTER_S`) where it asks for longer.
    ``timeout``: the seconds a request may take, named in the message of one that took longer; ``options``:
    whether the user gave the filesystem options of their own (which a TypeError of an unexpected keyword blames).

    Raises
    ------
    FileNotFoundError
        The key does not exist (not retried).
    RemoteReadError
        Naming ``where`` (URL and key), the failure and how many attempts were made.
    """
    delay = BACKOFF_S
    for attempt in range(retries + 1):
        try:
            return await request()
        except FileNotFoundError as error:
            code = (_s3_response(error) or {}).get("Error", {}).get("Code")
            if code == "NoSuchBucket":  # a 404 too, but no missing key: read as one, it gave fill values
                raise RemoteReadError(f"{where}: the bucket does not exist (NoSuchBucket); check the URL's bucket, "
                                      "and the endpoint or region it is asked at") from error
            raise
        except asyncio.CancelledError:
            raise
        except Exception as error:  # noqa: BLE001 - every library raises its own types; classified here
            unsigned = _no_credentials(error)
            if unsigned is not None:
                raise CredentialsUnavailable(f"{where}: {unsigned} ({describe_error(error)})") from error
            if options and isinstance(error, TypeError) and "unexpected keyword argument" in str(error):
                raise refusal(f"{where}: storage_options hold an option this URL's filesystem does not take "
                              f"({describe_error(error)}); they are fsspec's options of its protocol (e.g. 'anon' "
                              "and 'endpoint_url' are s3's), plus emfast's 'timeout' and 'retries'",
                              "storage_options") from error
            if _denied(error):
                raise RemoteAccessDenied(f"{where}: access denied ({describe_error(error)}); check the credentials "
                                         "(AWS_* environment variables, ~/.aws) or pass storage_options") from error
            if not _transient(error):
                raise RemoteReadError(f"{where}: cannot read it ({describe_error(error)})") from error
            asked = _retry_after(error)
            if attempt == retries:
                throttled = "" if asked is None else f"; the server last asked to wait {asked:g} s (Retry-After)"
                raise RemoteReadError(f"{where}: cannot read it after {retries + 1} attempts "
                                      f"({describe_error(error, timeout)}){throttled}") from error
        # a throttling server says how long to wait: backing off less only spends the attempts sooner
        await asyncio.sleep(max(delay * (0.5 + random.random()), min(asked or 0.0, MAX_RETRY_AFTER_S)))
        delay = min(MAX_BACKOFF_S, 2 * delay)


def _retry_after(error: BaseException) -> Optional[float]:
    """The seconds a ``Retry-After`` header of the response behind ``error`` asks for (a number, or an HTTP date),
    or None."""
    headers = getattr(error, "headers", None)
    if headers is None:
        response = _s3_response(error)
        headers = (response or {}).get("ResponseMetadata", {}).get("HTTPHeaders")
    value = None
    if headers is not None:
        try:
            value = headers.get("Retry-After") or headers.get("retry-after")
        except AttributeError:
            return None
    if not value:
        return None
    try:
        return max(0.0, float(value))
    except ValueError:
        try:
            when = email.utils.parsedate_to_datetime(str(value))
        except (TypeError, ValueError):
            return None
        return max(0.0, when.timestamp() - time.time())


def describe_error(error: BaseException, timeout: Optional[float] = None) -> str:
    """``error`` in a few words: its type and message, at most :data:`DESCRIBED_CHARS` of it, its start and its
    end (a parser's message quotes the bytes it could not parse; tensorstore's names the URL twice before the
    status); a request that took longer than ``timeout`` seconds says so."""
    parse = _parse_failure(error)
    if timeout is not None and _timed_out(error):
        text = f"no answer within {timeout:g} s each (storage_options timeout)"
    elif parse is not None:
        text = "a malformed response: " + (getattr(parse, "message", "") or str(parse) or type(parse).__name__)
    else:
        text = _TENSORSTORE_PAYLOADS.split(str(error), maxsplit=1)[0] or type(error).__name__
        text = text if type(error).__name__ in text else f"{type(error).__name__}: {text}"
    if len(text) <= DESCRIBED_CHARS:
        return text
    half = DESCRIBED_CHARS // 2
    return f"{text[:half]} ... {text[-half:]}"


def _wait(future, deadline: Optional[float] = None):
    """The result of ``future`` (a concurrent or tensorstore future), waited for in slices so that the thread's
    loader closing abandons it; TimeoutError past ``deadline`` (a ``time.monotonic()`` time)."""
    closed = getattr(_abandon, "closed", None)
    while True:
        left = None if deadline is None else deadline - time.monotonic()
        if left is not None and left <= 0:
            raise TimeoutError("the remote read took longer than its retries may")
        wait_s = left if closed is None else (_POLL_S if left is None else min(_POLL_S, left))
        try:
            return future.result(timeout=wait_s)
        except concurrent.futures.TimeoutError:  # TimeoutError itself, which tensorstore's futures raise too
            if future.done():  # ended as the slice did (or failed with a TimeoutError of its own): its outcome
                return future.result(timeout=0)
            if closed is not None and closed():
                future.cancel()
                raise ReadAbandoned("the loader closed while a remote read was in flight") from None


def zarr_read(coroutine):
    """Await a zarr-python coroutine (a read of an array on :meth:`RemoteStore.zarr_store`) on zarr's event loop,
    where its store's connections live, waited for as :meth:`RemoteStore.get` waits: a thread whose loader
    closes abandons it, and it is cancelled (zarr-python's own blocking calls wait for the network)."""
    from zarr.core.sync import _get_loop  # zarr-python names no public getter of its loop
    return _wait(asyncio.run_coroutine_threadsafe(coroutine, _get_loop()))


def _count(value, url: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise refusal(f"{url}: storage_options retries must be an integer >= 0, got {value!r}", "storage_options")
    return value


def _seconds(value, url: str) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not value > 0:
        raise refusal(f"{url}: storage_options timeout must be a positive number of seconds, got {value!r}",
                      "storage_options")
    return float(value)


def _check_common_options(options: dict, url: str) -> None:
    """Refuse the mistakes in fsspec's common options that the filesystems take silently or blame on the URL: an
    ``anon`` given as a string (a quoted YAML 'no' is true: the reads went unsigned, and were denied as if the
    credentials were wrong) and an ``endpoint_url`` without its scheme (botocore's "Invalid endpoint" came
    back as the URL being unreadable)."""
    if isinstance(options.get("anon"), str):  # the filesystems take any other value for its truth
        raise refusal(f"{url}: storage_options anon must be true or false, got the string {options['anon']!r} "
                      "(in YAML, leave out the quotes)", "storage_options")
    endpoint = options.get("endpoint_url")
    parts = urlsplit(endpoint) if isinstance(endpoint, str) else None
    if endpoint is not None and not (parts and parts.scheme in ("http", "https") and parts.netloc):
        raise refusal(f"{url}: storage_options endpoint_url must be an http:// or https:// URL (with its scheme, "
                      f"as http://127.0.0.1:9000), got {endpoint!r}", "storage_options")
