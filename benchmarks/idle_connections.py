#!/usr/bin/env python3
"""What idle connections cost an adapter (BENCHMARKS.md, "Idle connections", issue #33 item 2).

Starts the given adapter-file binary on one small ServiceEntry file, opens N TCP connections to
its gRPC port from this host that never open a stream (`silent`: not a byte; `preface`: the
HTTP/2 preface and an empty SETTINGS frame), and prints how many of them the adapter still holds
(its open file descriptors beyond those it had idle) and its RSS 1.5 s and 9.5 s later.

    cargo build -p adapter-file
    benchmarks/idle_connections.py target/debug/adapter-file silent 1000 [adapter flags...]
"""
import os
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request

SERVICE = """apiVersion: networking.istio.io/v1
kind: ServiceEntry
metadata: {name: a, namespace: ns}
spec:
  hosts: [a.example.com]
  resolution: STATIC
  ports: [{number: 80, name: http, protocol: HTTP}]
  endpoints: [{address: 10.0.0.1}]
"""
PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n" + b"\x00\x00\x00\x04\x00\x00\x00\x00\x00"


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def main():
    binary, mode, n = sys.argv[1], sys.argv[2], int(sys.argv[3])
    if mode not in ("silent", "preface"):
        sys.exit(f"mode must be silent or preface, not {mode!r}")
    work = tempfile.mkdtemp()
    with open(os.path.join(work, "a.yaml"), "w") as f:
        f.write(SERVICE)
    grpc, admin = free_port(), free_port()
    log = open(os.path.join(work, "adapter.log"), "w")
    adapter = subprocess.Popen(
        [binary, "--path", work, "--listen", f"127.0.0.1:{grpc}",
         "--admin-listen", f"127.0.0.1:{admin}"] + sys.argv[4:],
        env=dict(os.environ, RUST_LOG="warn"), stdout=subprocess.DEVNULL, stderr=log)
    try:
        for _ in range(200):
            try:
                urllib.request.urlopen(f"http://127.0.0.1:{admin}/readyz").read()
                break
            except OSError:
                time.sleep(0.1)
        else:
            sys.exit(f"the adapter never got ready; its log: {log.name}")

        def rss_mib():
            with open(f"/proc/{adapter.pid}/status") as status:
                for line in status:
                    if line.startswith("VmRSS"):
                        return int(line.split()[1]) / 1024
            return 0.0

        def fds():
            return len(os.listdir(f"/proc/{adapter.pid}/fd"))

        time.sleep(1)
        base_rss, base_fds = rss_mib(), fds()
        held = []
        for _ in range(n):
            s = socket.create_connection(("127.0.0.1", grpc))
            if mode == "preface":
                s.sendall(PREFACE)
            held.append(s)
        time.sleep(1.5)
        early = (fds() - base_fds, rss_mib())
        time.sleep(8)
        late = (fds() - base_fds, rss_mib())
        print(f"{os.path.basename(binary)} {mode} n={n}: idle RSS {base_rss:.1f} MiB; "
              f"+1.5 s: {early[0]} held, RSS {early[1]:.1f} MiB; "
              f"+9.5 s: {late[0]} held, RSS {late[1]:.1f} MiB")
    finally:
        adapter.kill()


if __name__ == "__main__":
    main()
