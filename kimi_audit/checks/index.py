"""Headers against model.safetensors.index.json: what loaders will look up, and where."""

from __future__ import annotations

from kimi_audit.checks.tensors import Located
from kimi_audit.constants import INDEX_FILE
from kimi_audit.findings import Finding, error, warning
from kimi_audit.format import ShardHeader
from kimi_audit.index import IndexFile


def index_findings(actual: Located, index: IndexFile | None, headers: dict[str, ShardHeader]) -> list[Finding]:
    if index is None:
        return []
    out: list[Finding] = []
    wm = index.weight_map
    get = wm.get
    listed_where_found = list(map(get, actual)) == [s for _t, s in actual.values()]
    for name in [] if listed_where_found else [n for n, (_t, s) in actual.items() if get(n) != s]:
        shard = actual[name][1]
        listed = get(name)
        if listed is None:
            out.append(error("INDEX_ENTRY_MISSING", f"{name} is in {shard} but not in {INDEX_FILE}: loaders "
                             "will not find it", tensor=name, shard=shard))
        elif listed != shard:
            out.append(error("INDEX_SHARD_MISMATCH", f"{name}: {INDEX_FILE} says {listed}, found in {shard}",
                             tensor=name, shard=shard, expected=listed, actual=shard))
    # Every actual name listed where it is, and as many names listed: then none is listed in vain.
    in_vain = [n for n in wm if n not in actual] if out or len(wm) != len(actual) else []
    for name in in_vain:
        shard = wm[name]
        if shard in headers:
            out.append(error("INDEX_TENSOR_ABSENT", f"{name}: {INDEX_FILE} maps it to {shard}, whose header "
                             "lacks it", tensor=name, shard=shard))
    if index.total_size is not None and all(shard in headers for shard in index.shards):
        payload = sum(h.payload_bytes for h in headers.values())
        if payload != index.total_size:
            out.append(warning("INDEX_TOTAL_SIZE", f"{INDEX_FILE} metadata.total_size is {index.total_size:,}; "
                               f"the shards' tensor payloads sum to {payload:,}",
                               expected=payload, actual=index.total_size))
    return out
