#!/usr/bin/env python3
"""A demo backend: an HTTP server on ADDRESS:PORT that answers every GET with its NAME.

Usage: backend.py NAME ADDRESS PORT

scripts/demo.sh runs one per registered instance, each on a loopback address of its own
(127.0.0.11, 127.0.0.12, ...): the sidecar (Envoy without traffic capture) binds the service
port on 127.0.0.1, so backends of the same port live on the other loopback addresses.
HTTP/1.1 with keep-alive, as Envoy's connection pool expects; one thread per connection.
"""

import sys
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


def main() -> None:
    if len(sys.argv) != 4:
        sys.exit(__doc__)
    name, address, port = sys.argv[1], sys.argv[2], int(sys.argv[3])
    body = (name + "\n").encode()

    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def do_GET(self) -> None:  # noqa: N802 (http.server's naming)
            self.send_response(200)
            self.send_header("Content-Type", "text/plain")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def do_HEAD(self) -> None:  # noqa: N802
            self.send_response(200)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()

        def log_message(self, fmt: str, *args: object) -> None:
            # One line per request on stderr (the demo's log of this backend).
            sys.stderr.write("%s %s\n" % (name, fmt % args))

    class Server(ThreadingHTTPServer):
        daemon_threads = True
        allow_reuse_address = True

    server = Server((address, port), Handler)
    print(f"{name} listening on {address}:{port}", flush=True)
    server.serve_forever()


if __name__ == "__main__":
    main()
