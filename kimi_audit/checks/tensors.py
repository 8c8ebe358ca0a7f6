"""Where each tensor actually is: one table over all shard headers."""

from __future__ import annotations

from itertools import repeat

from kimi_audit.findings import Finding, error
from kimi_audit.format import ShardHeader, TensorInfo

Located = dict[str, tuple[TensorInfo, str]]
"""Tensor name -> (its header entry, the shard holding it)."""


def locate_tensors(headers: dict[str, ShardHeader]) -> tuple[Located, list[Finding]]:
    located: Located = {}
    for shard, header in headers.items():
        c = header.columns
        infos = map(tuple.__new__, repeat(TensorInfo), zip(c.names, c.dtypes, c.shapes, c.begins, c.ends))
        located.update(zip(c.names, zip(infos, repeat(shard))))
    if len(located) == sum(h.tensor_count for h in headers.values()):
        return located, []
    return _locate_with_duplicates(headers)


def _locate_with_duplicates(headers: dict[str, ShardHeader]) -> tuple[Located, list[Finding]]:
    located: Located = {}
    findings: list[Finding] = []
    for shard, header in headers.items():
        tensors = header.tensors
        for name, info in tensors.items():
            prev = located.get(name)
            if prev is not None:
                findings.append(error("TENSOR_DUPLICATE", f"{name} is stored in both {prev[1]} and {shard}",
                                      tensor=name, shard=shard, expected=prev[1], actual=shard))
                continue
            located[name] = (info, shard)
    return located, findings
