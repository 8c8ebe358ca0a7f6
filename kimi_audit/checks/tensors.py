"""Where each tensor actually is: one table over all shard headers."""

from __future__ import annotations

from itertools import repeat

from kimi_audit.findings import Finding, error
from kimi_audit.format import ShardHeader, TensorInfo

Located = dict[str, tuple[TensorInfo, str]]
"""Tensor name -> (its header entry, the shard holding it)."""


def locate_tensors(headers: dict[str, ShardHeader]) -> tuple[Located, list[Finding]]:
    located: Located = {}
    findings: list[Finding] = []
    for shard, header in headers.items():
        tensors = header.tensors
        if not tensors.keys() & located.keys():
            located.update(zip(tensors, zip(tensors.values(), repeat(shard))))
            continue
        for name, info in tensors.items():
            prev = located.get(name)
            if prev is not None:
                findings.append(error("TENSOR_DUPLICATE", f"{name} is stored in both {prev[1]} and {shard}",
                                      tensor=name, shard=shard, expected=prev[1], actual=shard))
                continue
            located[name] = (info, shard)
    return located, findings
