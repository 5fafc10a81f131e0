#!/usr/bin/env python3
"""Small helpers of scripts/demo.sh (Python's standard library only).

  util.py free ADDR:PORT...        exit 1, naming them, if any of these cannot be bound now
  util.py served NAME=N...         reads `mcpctl get serviceentries -o json` on stdin: exit 0
                                   when every NAME is served with N endpoints
  util.py istiod HTTP_ADDR NS...   what istiod holds: its /debug/registryz hosts of the
                                   namespaces NS (the adapters' ones), their endpoints from
                                   /debug/endpointShardz, and its /debug/configz names
"""

import json
import socket
import sys
import urllib.request


def free(addrs: list[str]) -> int:
    taken = []
    for a in addrs:
        host, port = a.rsplit(":", 1)
        s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        # As a server binds: a port in TIME_WAIT is free, one something listens on is not.
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((host, int(port)))
        except OSError as e:
            taken.append(f"{a} ({e.strerror})")
        finally:
            s.close()
    if taken:
        print("\n".join(taken))
        return 1
    return 0


def served(expected: list[str]) -> int:
    try:
        items = json.load(sys.stdin).get("items") or []
    except ValueError:
        return 1
    have = {i["metadata"]["name"]: len(i["spec"].get("endpoints") or []) for i in items}
    for e in expected:
        name, n = e.split("=")
        if have.get(name) != int(n):
            return 1
    return 0


def get(addr: str, path: str):
    with urllib.request.urlopen(f"http://{addr}{path}", timeout=10) as r:
        return json.load(r)


def istiod(addr: str, namespaces: list[str]) -> int:
    registry = get(addr, "/debug/registryz")
    shards = get(addr, "/debug/endpointShardz")
    configz = get(addr, "/debug/configz")
    rows = []
    for s in registry:
        attrs = s.get("Attributes") or {}
        ns = attrs.get("Namespace", "")
        if ns not in namespaces:
            continue
        host = s.get("hostname", "")
        ports = ",".join(
            f"{p.get('port')}/{p.get('protocol')}" for p in (s.get("ports") or [])
        )
        # endpointShardz: host -> namespace -> {"Shards": {"<registry>/<cluster>": [endpoints]}}
        eps = []
        for shard in ((shards.get(host) or {}).get(ns) or {}).get("Shards", {}).values():
            for ep in shard or []:
                addrs = ep.get("Addresses") or [ep.get("Address", "?")]
                eps.append(addrs[0])
        rows.append((ns, host, attrs.get("ServiceRegistry", ""), ports, sorted(eps)))
    rows.sort()
    print(f"  {'NAMESPACE':<10} {'HOST':<36} {'REGISTRY':<9} {'PORTS':<12} ENDPOINTS")
    for ns, host, reg, ports, eps in rows:
        print(f"  {ns:<10} {host:<36} {reg:<9} {ports:<12} {' '.join(eps) or '-'}")
    kinds: dict[str, list[str]] = {}
    for c in configz:
        meta = c.get("metadata") or {}
        kinds.setdefault(c.get("kind", "?"), []).append(
            f"{meta.get('namespace', '')}/{meta.get('name', '')}"
        )
    print("  /debug/configz:")
    for kind in sorted(kinds):
        names = sorted(kinds[kind])
        print(f"    {len(names)} {kind}: {' '.join(names)}")
    return 0


def main() -> int:
    if len(sys.argv) < 2:
        sys.exit(__doc__)
    cmd, args = sys.argv[1], sys.argv[2:]
    if cmd == "free":
        return free(args)
    if cmd == "served":
        return served(args)
    if cmd == "istiod":
        return istiod(args[0], args[1:])
    sys.exit(__doc__)


if __name__ == "__main__":
    sys.exit(main())
