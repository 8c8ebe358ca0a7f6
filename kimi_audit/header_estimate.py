"""How many bytes to ask for in a shard's first read, from the tensor names the index lists for it.

A local read costs nothing extra when it is too big or too small; a remote one costs a round trip when
too small and bandwidth when too big.
"""

from __future__ import annotations

# `"NAME":{"dtype":"F8_E4M3","shape":[18432,7168],"data_offsets":[12345678901,12345678901]},`
ENTRY_OVERHEAD = 96
FIXED = 8 + 64 + 256


def first_read_bytes(tensor_names: list[str]) -> int:
    return FIXED + sum(len(n) + ENTRY_OVERHEAD for n in tensor_names)
