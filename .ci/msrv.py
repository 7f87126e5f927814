"""Fails when a locked dependency declares a rust-version newer than lockset's own.

Reads `cargo metadata --format-version 1 --all-features --locked` on stdin.
"""

import json
import sys


def version(text):
    return tuple(int(part) for part in text.split("."))


meta = json.load(sys.stdin)
ours = next(p for p in meta["packages"] if p["name"] == "lockset")["rust_version"]
used = {node["id"] for node in meta["resolve"]["nodes"]}
newer = [
    f"{p['name']} {p['version']} needs {p['rust_version']}"
    for p in meta["packages"]
    if p["id"] in used and p["rust_version"] and version(p["rust_version"]) > version(ours)
]
if newer:
    sys.exit(f"dependencies newer than rust-version {ours}: " + ", ".join(newer))
print(f"every locked dependency builds with rust-version {ours} or older")
