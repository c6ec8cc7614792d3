"""Servers on 127.0.0.1 that the remote-store tests and benchmark start and stop themselves: an HTTP server of a
directory that adds latency to every request and fails requests on demand, and moto's S3 server."""
import contextlib
import functools
import http.server
import sys
import logging
import math
import os
import socket
import threading
import time
from pathlib import Path

#: How long a "hang" fault holds a request at most (the server's stop releases it at once).
HANG_S = 20.0


class FaultyHandler(http.server.SimpleHTTPRequestHandler):
    """Serves the server's directory; waits ``server.latency`` first, and applies the first fault queued for the
    request's path: an HTTP status, "truncate" (half the body, then the connection closes), "hang", "whole" (a
    byte-range request answered with the whole file, 200, as a server that ignores Range may), "garbled" (the
    file's bytes where the status line belongs, as a kept-alive connection holds after a response whose body ran
    past its Content-Length), or ("redirect", url) (a 302 to ``url`` + the path). Requests whose path holds a
    pattern of ``server.throttled`` before its time are answered 429 with ``Retry-After`` (seconds left, rounded
    up); with ``server.missing`` "page", a missing file is a web page with status 200 (as some static hosts
    answer)."""

    protocol_version = "HTTP/1.1"  # keep-alive, as web servers and object stores answer
    # Headers and body go out as two small writes: with Nagle's algorithm the body waited for the client's delayed
    # ACK, 40 ms per request on a kept-alive connection, which servers of the field do not add.
    disable_nagle_algorithm = True

    def log_message(self, *args) -> None:  # quiet tests
        pass

    def _fault(self):
        with self.server.lock:
            self.server.requests.append(self.path)
            for pattern, queue in self.server.faults.items():
                if pattern in self.path and queue:
                    return queue.pop(0)
        return None

    def _serve(self, head: bool) -> None:
        with self.server.lock:
            self.server.in_flight += 1
            self.server.most_in_flight = max(self.server.most_in_flight, self.server.in_flight)
        try:
            self._respond(head)
        finally:
            with self.server.lock:
                self.server.in_flight -= 1

    def _respond(self, head: bool) -> None:
        time.sleep(self.server.latency)
        left = max([until - time.monotonic() for pattern, until in self.server.throttled.items()
                    if pattern in self.path] + [0.0])
        if left > 0:
            with self.server.lock:
                self.server.requests.append(self.path)
            self.send_response(429)
            self.send_header("Retry-After", str(math.ceil(left)))
            self.send_header("Content-Length", "0")
            self.end_headers()
            return
        fault = self._fault()
        if isinstance(fault, tuple) and fault[0] == "redirect":
            self.send_response(302)
            self.send_header("Location", fault[1] + self.path)
            self.send_header("Content-Length", "0")
            self.end_headers()
            return
        if self.server.missing == "page" and not Path(self.translate_path(self.path)).exists():
            page = b"<!DOCTYPE html><html><body>Not here, but welcome</body></html>"
            self.send_response(200)
            self.send_header("Content-Type", "text/html")
            self.send_header("Content-Length", str(len(page)))
            self.end_headers()
            self.wfile.write(page)
            return
        if fault == "hang":
            with self.server.lock:
                released = self.server.released
            released.wait(HANG_S)
            self.close_connection = True
            return
        if isinstance(fault, int):
            self.send_error(fault)
            return
        if self.server.missing != 404 and not Path(self.translate_path(self.path)).exists():
            self.send_error(self.server.missing)  # S3 denies a missing key to a reader who may not list the bucket
            return
        if fault == "garbled":
            path = Path(self.translate_path(self.path))
            self.wfile.write(b"\x28\xb5\x2f\xfd" + (path.read_bytes() if path.is_file() else b"") + b"\r\n\r\n")
            self.close_connection = True
            return
        if fault == "truncate":
            path = Path(self.translate_path(self.path))
            data = path.read_bytes() if path.is_file() else b""
            self.send_response(200)
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data[:len(data) // 2])
            self.close_connection = True
            return
        if not head and self.headers.get("Range") and fault != "whole":
            self._serve_range(self.headers["Range"])
            return
        super().do_HEAD() if head else super().do_GET()

    def _serve_range(self, header: str) -> None:
        """A byte range (``bytes=a-b``, ``bytes=a-``, ``bytes=-n``), as object stores and web servers answer it:
        zarr's shards and precomputed's sharded files are read by range."""
        path = Path(self.translate_path(self.path))
        if not path.is_file():
            self.send_error(404)
            return
        data = path.read_bytes()
        first, _, last = header.removeprefix("bytes=").partition("-")
        if not first:
            start, stop = max(0, len(data) - int(last)), len(data)
        else:
            start, stop = int(first), min(len(data), int(last) + 1 if last else len(data))
        if start >= len(data):
            self.send_error(416)
            return
        self.send_response(206)
        self.send_header("Content-Range", f"bytes {start}-{stop - 1}/{len(data)}")
        self.send_header("Content-Length", str(stop - start))
        self.end_headers()
        self.wfile.write(data[start:stop])

    def do_GET(self) -> None:
        self._serve(head=False)

    def do_HEAD(self) -> None:
        self._serve(head=True)


class FaultyServer(http.server.ThreadingHTTPServer):
    daemon_threads = True
    allow_reuse_address = True
    request_queue_size = 256  # a chunk cache requests many chunks at once; the default 5 refuses connections

    def release_hangs(self) -> None:
        """End the requests "hang" faults hold now (their connections close unanswered); later ones hold again."""
        with self.lock:
            released, self.released = self.released, threading.Event()
        released.set()

    def handle_error(self, request, client_address) -> None:
        """Quiet about clients that hang up mid-request (a loader closing cancels its requests)."""
        if not isinstance(sys.exc_info()[1], (ConnectionResetError, BrokenPipeError)):
            super().handle_error(request, client_address)


@contextlib.contextmanager
def http_server(directory, latency: float = 0.0):
    """An HTTP server of ``directory`` on 127.0.0.1; yields it (``.url``, ``.faults``: path part -> list of faults
    applied one per request, ``.throttled``: path part -> ``time.monotonic()`` until which its requests are
    throttled, ``.requests``, ``.latency``, ``.most_in_flight``: the most requests served at once, ``.missing``: the
    status of a missing file, 404, or "page"), stopped on exit."""
    handler = functools.partial(FaultyHandler, directory=str(directory))
    server = FaultyServer(("127.0.0.1", 0), handler)
    server.latency, server.faults, server.requests, server.missing = latency, {}, [], 404
    server.throttled = {}
    server.in_flight = server.most_in_flight = 0
    server.lock, server.released = threading.Lock(), threading.Event()
    server.url = f"http://127.0.0.1:{server.server_address[1]}"
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
    thread.start()
    try:
        yield server
    finally:
        server.release_hangs()
        server.shutdown()
        server.server_close()
        thread.join(10)


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


#: S3's error responses for the statuses a fault may give: (reason, S3 error code, message), as S3 documents them.
S3_ERRORS = {500: ("Internal Server Error", "InternalError", "We encountered an internal error. Please try again."),
             503: ("Slow Down", "SlowDown", "Please reduce your request rate."),
             403: ("Forbidden", "AccessDenied", "Access Denied"),
             404: ("Not Found", "NoSuchBucket", "The specified bucket does not exist")}


def _moto_server(port: int, delay: list, faults: dict):
    """moto's threaded S3 server, waiting ``delay[0]`` seconds before answering each request, and answering a
    GET or HEAD whose path holds a key of ``faults`` with the first status queued there (an S3 error response)."""
    from moto.server import DomainDispatcherApplication, ThreadedMotoServer, create_backend_app
    from werkzeug.serving import make_server

    lock = threading.Lock()

    def fault(environ):
        if environ["REQUEST_METHOD"] not in ("GET", "HEAD"):
            return None
        with lock:
            for pattern, queue in faults.items():
                if pattern in environ.get("PATH_INFO", "") and queue:
                    return queue.pop(0)
        return None

    class Delayed(ThreadedMotoServer):
        def _server_entry(self) -> None:
            app = DomainDispatcherApplication(create_backend_app)

            def delayed(environ, start_response):
                time.sleep(delay[0])
                status = fault(environ)
                if status is None:
                    return app(environ, start_response)
                reason, code, message = S3_ERRORS[status]
                body = (f'<?xml version="1.0" encoding="UTF-8"?><Error><Code>{code}</Code><Message>{message}'
                        f'</Message><RequestId>emfast-test</RequestId></Error>').encode()
                start_response(f"{status} {reason}", [("Content-Type", "application/xml"),
                                                      ("Content-Length", str(len(body)))])
                return [b"" if environ["REQUEST_METHOD"] == "HEAD" else body]

            self._server = make_server(self._ip_address, self._port, delayed, True)
            self._server_ready_event.set()
            self._server.serve_forever()

    return Delayed(ip_address="127.0.0.1", port=port, verbose=False)


@contextlib.contextmanager
def s3_server(delay: list = None, faults: dict = None):
    """moto's S3 server on 127.0.0.1 with fake credentials in the environment; yields its endpoint URL. ``delay``:
    a one-element list, the seconds each request waits (changeable while it runs); ``faults``: path part -> list
    of statuses (500, 503, 403) applied one per GET or HEAD (changeable while it runs)."""
    logging.getLogger("werkzeug").setLevel(logging.WARNING)  # one line per request otherwise
    port = free_port()
    server = _moto_server(port, [0.0] if delay is None else delay, {} if faults is None else faults)
    saved = {k: os.environ.get(k) for k in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_DEFAULT_REGION")}
    os.environ.update(AWS_ACCESS_KEY_ID="testing", AWS_SECRET_ACCESS_KEY="testing", AWS_DEFAULT_REGION="us-east-1")
    server.start()
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.stop()
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value


def upload(endpoint: str, bucket: str, directory, prefix: str = "") -> None:
    """Upload every file below ``directory`` to ``s3://bucket/prefix/...`` (creating the bucket)."""
    import boto3
    client = boto3.client("s3", endpoint_url=endpoint, region_name="us-east-1")
    with contextlib.suppress(client.exceptions.BucketAlreadyOwnedByYou):
        client.create_bucket(Bucket=bucket)
    directory = Path(directory)
    for path in directory.rglob("*"):
        if path.is_file():
            key = "/".join(p for p in (prefix, path.relative_to(directory).as_posix()) if p)
            client.put_object(Bucket=bucket, Key=key, Body=path.read_bytes())


def main(argv) -> None:
    """``python remote_servers.py http DIRECTORY LATENCY`` or ``... s3 DIRECTORY LATENCY BUCKET``: serve (S3: after
    uploading DIRECTORY to BUCKET) in this process, print the URL, stop when stdin closes. The benchmark runs its
    servers this way, so that they do not share its GIL."""
    kind, directory, latency = argv[0], argv[1], float(argv[2])
    delay = [0.0]
    with http_server(directory, latency) if kind == "http" else s3_server(delay) as server:
        if kind == "s3":
            upload(server, argv[3], directory)
            delay[0] = latency
        print(server.url if kind == "http" else server, flush=True)
        sys.stdin.read()


if __name__ == "__main__":
    main(sys.argv[1:])
