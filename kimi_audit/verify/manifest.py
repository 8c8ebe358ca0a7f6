"""Model manifests in OpenSSF model-signing's form (sigstore/model-transparency, predicate v1.0).

The manifest is an in-toto Statement v1 whose predicate lists every file of the model with its sha256,
exactly as `model_signing` builds the payload it signs::

    {"_type": "https://in-toto.io/Statement/v1",
     "subject": [{"name": MODEL, "digest": {"sha256": ROOT}, "annotations": {"revision": COMMIT}}],
     "predicateType": "https://model_signing/signature/v1.0",
     "predicate": {"serialization": {"method": "files", "hash_type": "sha256", "allow_symlinks": true,
                                     "ignore_paths": [...]},
                   "resources": [{"name": "model-1-of-61.safetensors", "algorithm": "sha256",
                                  "digest": HEX}, ...],
                   "kimi_audit": {"version": 1, "revision": COMMIT, "source": LABEL,
                                  "tensors": {FILE: {TENSOR: HEX}}}}}

Resources are sorted by path components (model_signing's order); ROOT is the sha256 of their digests'
bytes in that order (what model_signing checks before it trusts the list). Per-tensor digests sit under
the predicate's `kimi_audit` key, which verifiers of predicate v1.0 ignore; so does the subject's
`annotations` (an in-toto ResourceDescriptor field). Reading also accepts a Sigstore bundle (model.sig)
or a DSSE envelope around such a statement; their signatures are not checked here (`model_signing verify`
does that).
"""

from __future__ import annotations

import base64
import hashlib
import json
import re
import reprlib
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from kimi_audit.errors import KimiAuditError, ManifestError
from kimi_audit.outputs import write_atomic
from kimi_audit.sources.files import open_regular

STATEMENT_TYPE = "https://in-toto.io/Statement/v1"
PREDICATE_TYPE = "https://model_signing/signature/v1.0"
EXTENSION = "kimi_audit"
IGNORE_PATHS = ("model.sig", ".git", ".gitattributes", ".github", ".gitignore")
"""model_signing's default ignored paths: never listed, never reported unlisted."""
MAX_MANIFEST_BYTES = 512_000_000
_HEX64 = re.compile(r"^[0-9a-f]{64}$")


@dataclass(frozen=True)
class Manifest:
    model: str
    files: dict[str, str]
    """File name (posix, relative) -> sha256 hex."""
    revision: str | None = None
    source: str | None = None
    tensors: dict[str, dict[str, str]] = field(default_factory=dict)
    """File -> tensor name -> sha256 hex (empty when the manifest carries none)."""
    ignore: tuple[str, ...] = ()
    """Files of the directory the manifest leaves out beyond model_signing's defaults: itself, written inside
    the checkpoint, and a manifest read there (listed in `serialization.ignore_paths`)."""


def ignored(name: str) -> bool:
    """Files a model manifest leaves out: model_signing's defaults, and huggingface_hub's download metadata."""
    first = name.split("/", 1)[0]
    return first in IGNORE_PATHS or name.startswith(".cache/huggingface/")


def ignore_paths(m: Manifest) -> list[str]:
    """`serialization.ignore_paths`: model_signing's defaults, less any that holds a file the manifest lists
    (a shard the index put under .git/ is verified and listed), and the manifest's own `ignore`."""
    listed = {name.split("/", 1)[0] for name in m.files}
    return [p for p in IGNORE_PATHS if p not in listed] + sorted(set(m.ignore) - set(IGNORE_PATHS))


def _order(name: str) -> list[str]:
    return name.split("/")


def root_digest(files: Mapping[str, str]) -> str:
    h = hashlib.sha256()
    for name in sorted(files, key=_order):
        h.update(bytes.fromhex(files[name]))
    return h.hexdigest()


def manifest_statement(m: Manifest) -> dict[str, Any]:
    """The in-toto statement model_signing would sign for these files (plus the per-tensor extension)."""
    subject: dict[str, Any] = {"name": m.model, "digest": {"sha256": root_digest(m.files)}}
    if m.revision:
        subject["annotations"] = {"revision": m.revision}
    ext: dict[str, Any] = {"version": 1, "revision": m.revision, "source": m.source}
    if m.tensors:
        ext["tensors"] = {f: dict(sorted(m.tensors[f].items())) for f in sorted(m.tensors, key=_order)}
    return {
        "_type": STATEMENT_TYPE,
        "subject": [subject],
        "predicateType": PREDICATE_TYPE,
        "predicate": {
            "serialization": {"method": "files", "hash_type": "sha256", "allow_symlinks": True,
                              "ignore_paths": ignore_paths(m)},
            "resources": [{"name": n, "algorithm": "sha256", "digest": m.files[n]}
                          for n in sorted(m.files, key=_order)],
            EXTENSION: ext,
        },
    }


def write_manifest(m: Manifest, path: Path) -> None:
    """Written whole under an exclusive temporary name, then renamed over `path` (never through a link)."""
    text = json.dumps(manifest_statement(m), indent=1) + "\n"
    try:
        write_atomic(path, text.encode("utf-8"))
    except OSError as e:
        raise KimiAuditError(f"cannot write the manifest {path}: {e.strerror or e}") from None


def read_manifest(path: Path) -> Manifest:
    try:
        with open(open_regular(path, str(path)), "rb") as f:  # a FIFO or device is refused, never waited on
            raw = f.read(MAX_MANIFEST_BYTES + 1)
    except OSError as e:
        raise ManifestError(f"cannot read the manifest {path}: {e.strerror or e}") from None
    if len(raw) > MAX_MANIFEST_BYTES:
        raise ManifestError(f"{path}: over {MAX_MANIFEST_BYTES:,} bytes, not a model manifest")
    try:
        doc = json.loads(raw)
    except (ValueError, UnicodeDecodeError) as e:
        raise ManifestError(f"{path}: not JSON ({e})") from None
    except RecursionError:
        raise ManifestError(f"{path}: JSON nested too deep to be a model manifest") from None
    return parse_manifest(_statement_of(doc, path), path)


def _statement_of(doc: Any, path: Path) -> Any:
    """The statement itself, or the one inside a Sigstore bundle / DSSE envelope (signature not checked)."""
    if isinstance(doc, dict) and "_type" not in doc:
        envelope = doc.get("dsseEnvelope", doc)
        payload = envelope.get("payload") if isinstance(envelope, dict) else None
        if isinstance(payload, str):
            try:
                return json.loads(base64.b64decode(payload, validate=True))
            except (ValueError, UnicodeDecodeError) as e:
                raise ManifestError(f"{path}: the DSSE payload is not a base64 JSON statement ({e})") from None
            except RecursionError:
                raise ManifestError(f"{path}: the DSSE payload is JSON nested too deep") from None
    return doc


def parse_manifest(doc: Any, path: Path | str = "manifest") -> Manifest:
    def bad(why: str) -> ManifestError:
        return ManifestError(f"{path}: {why}")

    if not isinstance(doc, dict) or doc.get("_type") != STATEMENT_TYPE:
        raise bad(f"not an in-toto statement ({STATEMENT_TYPE})")
    if doc.get("predicateType") != PREDICATE_TYPE:
        raise bad(f"predicateType {_clip(doc.get('predicateType'))}, expected {PREDICATE_TYPE}")
    pred, subjects = doc.get("predicate"), doc.get("subject")
    if not isinstance(pred, dict) or not isinstance(subjects, list) or len(subjects) != 1 \
            or not isinstance(subjects[0], dict):
        raise bad("a model manifest has one subject and a predicate object")
    serialization = pred.get("serialization")
    if not isinstance(serialization, dict) or serialization.get("method") != "files" \
            or serialization.get("hash_type") != "sha256":
        raise bad("only the `files` serialization with sha256 is supported (not shards, not other hashes)")
    files: dict[str, str] = {}
    resources = pred.get("resources")
    for r in resources if isinstance(resources, list) else []:
        if not isinstance(r, dict) or r.get("algorithm") != "sha256" or not isinstance(r.get("name"), str) \
                or not isinstance(r.get("digest"), str) or not _HEX64.match(r["digest"]):
            raise bad(f"resource {_clip(r)} is not {{name, algorithm: sha256, digest: 64 hex digits}}")
        if r["name"] in files:
            raise bad(f"resource {_clip(r['name'])} is listed twice")
        files[r["name"]] = r["digest"]
    digest = subjects[0].get("digest")
    root = digest.get("sha256") if isinstance(digest, dict) else None
    if root != root_digest(files):
        raise bad(f"inconsistent: the subject's digest is {_clip(root)}, the resources hash to {root_digest(files)}")
    raw_ext = pred.get(EXTENSION)
    ext: dict[str, Any] = raw_ext if isinstance(raw_ext, dict) else {}
    annotations = subjects[0].get("annotations")
    revision = ext.get("revision") or (annotations.get("revision") if isinstance(annotations, dict) else None)
    tensors: dict[str, dict[str, str]] = {}
    raw_tensors = ext.get("tensors")
    if isinstance(raw_tensors, dict):
        for f, table in raw_tensors.items():
            if isinstance(table, dict):
                tensors[f] = {k: v for k, v in table.items() if isinstance(v, str) and _HEX64.match(v)}
    name = subjects[0].get("name")
    return Manifest(name if isinstance(name, str) else "", files, revision if isinstance(revision, str) else None,
                    ext.get("source") if isinstance(ext.get("source"), str) else None, tensors)


_REPR = reprlib.Repr()
_REPR.maxlevel, _REPR.maxstring, _REPR.maxother = 3, 120, 120


def _clip(value: Any) -> str:
    """A value from the manifest as it reads in a message: its repr cut short (reprlib: a few levels deep,
    long strings elided), so a deep or huge value makes neither a RecursionError nor a huge message."""
    return _REPR.repr(value)
