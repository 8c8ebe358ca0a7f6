"""Add each committed safetensors file's per-tensor sha256 to its fixture's PROVENANCE.json (`tensor_sha256`).

A PROVENANCE.json pins every written file's whole-file sha256 as its writer produced it. Those cannot all be
produced again: the writers ran in their own venvs, gone since, and a writer that stores its header's metadata
in another key order on every run gives another file (and another whole-file hash) for the same tensors. What a
second run could agree on is the tensors: this script records, for every `*.safetensors` file under a fixture's
folder, the sha256 of each tensor's bytes, by name in sorted order, computed from the committed files (the
whole-file hashes stay as recorded). tests/test_writer_fixtures.py computes them again and compares.

Standard library only (the safetensors header is read as the format defines it: an 8-byte little-endian length,
then the JSON header, then the payload the entries' `data_offsets` point into). Run from the repository root:

    python tests/writers/tensor_digests.py           # rewrite every PROVENANCE.json's tensor_sha256
    python tests/writers/tensor_digests.py --check   # exit 1 where one differs
"""

from __future__ import annotations

import hashlib
import json
import struct
import sys
from pathlib import Path

DATA = Path(__file__).resolve().parent.parent / "data"
KEY = "tensor_sha256"


def tensor_digests(path: Path) -> dict[str, str]:
    """name -> sha256 of the tensor's bytes, names sorted, of one safetensors file."""
    with path.open("rb") as f:
        (n,) = struct.unpack("<Q", f.read(8))
        header = json.loads(f.read(n))
        start = 8 + n
        out = {}
        for name in sorted(k for k in header if k != "__metadata__"):
            begin, end = header[name]["data_offsets"]
            f.seek(start + begin)
            out[name] = hashlib.sha256(f.read(end - begin)).hexdigest()
    return out


def provenance_digests(provenance: Path) -> dict[str, dict[str, str]]:
    """Every safetensors file under the fixture's folder (relative to it, sorted) -> its tensor digests."""
    folder = provenance.parent
    return {str(p.relative_to(folder)): tensor_digests(p) for p in sorted(folder.rglob("*.safetensors"))}


def provenances() -> list[Path]:
    """Every fixture's PROVENANCE.json that lies beside safetensors files."""
    return [p for p in sorted(DATA.rglob("PROVENANCE.json")) if any(p.parent.rglob("*.safetensors"))]


def main(argv: list[str]) -> int:
    differ = []
    for provenance in provenances():
        doc = json.loads(provenance.read_text())
        want = provenance_digests(provenance)
        if doc.get(KEY) == want:
            continue
        differ.append(str(provenance))
        if "--check" not in argv:
            doc[KEY] = want
            provenance.write_text(json.dumps(doc, indent=2, ensure_ascii=False) + "\n")
    for p in differ:
        print(("differs: " if "--check" in argv else "written: ") + p)
    return 1 if differ and "--check" in argv else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
