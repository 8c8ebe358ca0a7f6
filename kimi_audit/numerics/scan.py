"""Value-scan kernels for `verify`: weight health read off the bytes already in memory for hashing.

Hashing is the cost of `verify` (sha256 at ~1.8 GB/s a core); these kernels must cost a few percent of it,
so they run on spans of a few hundred KB just hashed (still in the core's cache) and FP8 bytes are never
decoded: a NaN of F8_E4M3 is the byte 0x7F or 0xFF, ±448 (the largest finite value, where block
quantization puts each block's maximum) is 0x7E or 0xFE. Byte-coded scales are checked on their codes too: an
E8M0 scale (DeepSeek-V4's F8_E8M0, MXFP4's U8 exponents) is NaN at 0xFF, an F8_E4M3 scale (NVFP4's) at
0x7F / 0xFF and not positive at 0x00, 0x80 or a set sign bit. `find` on the buffer is memchr (tens of GB/s):
it screens for NaNs, and counts the ±448 bytes by stepping from one to the next (a real checkpoint holds
about two per 128×128 block), with one numpy pass instead where they are dense. An all-zero block is
screened for a run of 0x00 bytes as wide as the narrowest block (memchr for a zero, then a look at its
run); only where a run exists is the band of blocks around it checked exactly. BF16 / F16 / F32 tensors
and the scales are checked on their bit patterns with numpy (no ml_dtypes): a max-reduction screens, exact
counts only when it fires.

`buf` is bytes (a Hub range), a bytearray or an mmap (all have `find` and the buffer protocol). numpy is
imported only by the kernels that need it, so a worker that only meets FP8 weights never loads it. Offsets
passed in are into `buf`; the offsets returned are element offsets relative to the span's start.
"""

from __future__ import annotations

import mmap
from typing import TYPE_CHECKING

from kimi_audit.constants import DTYPE_BITS
from kimi_audit.format.gguf_types import E8M0, F16, F32, GGML_BY_NAME, IQ1_M_F16

if TYPE_CHECKING:
    import numpy as np

ZEROS = bytes(1 << 16)
FP8_NAN = (b"\x7f", b"\xff")
FP8_MAX = (b"\x7e", b"\xfe")
DENSE_SHIFT = 12
"""A span holding more than len/2**DENSE_SHIFT bytes of one value (a block-quantized weight holds about
len/2**13 of ±448) is counted with numpy instead."""

# dtype -> (unsigned view, exponent mask, sign-cleared mask)
FLOAT_BITS = {"BF16": ("<u2", 0x7F80, 0x7FFF), "F16": ("<u2", 0x7C00, 0x7FFF), "F32": ("<u4", 0x7F800000, 0x7FFFFFFF),
              "F64": ("<u8", 0x7FF0000000000000, 0x7FFFFFFFFFFFFFFF), "F8_E5M2": ("u1", 0x7C, 0x7F),
              "C64": ("<u4", 0x7F800000, 0x7FFFFFFF)}
"""Every IEEE-style float dtype a checkpoint may hold, F8_E4M3 apart (FP8 weights have their own kernel): a value
whose magnitude bits equal the exponent mask is ±Inf, above it NaN. C64 is scanned as its F32 parts (real and
imaginary: a count of parts, each a value's half)."""
FNUZ_DTYPES = ("F8_E4M3FNUZ", "F8_E5M2FNUZ")
"""The "fnuz" FP8 types: no Inf, one NaN (0x80, negative zero's code)."""
SCANNED_FLOATS = frozenset((*FLOAT_BITS, *FNUZ_DTYPES))

Buffer = bytes | bytearray | mmap.mmap


GGML_NO_VALUE = {F16: 0x7C00, IQ1_M_F16: 0x7C00, F32: 0x7F800000, E8M0: 0xFF}
"""A scale field's code whose bits under this mask are all set is no value (F16, F32: NaN or ±Inf; E8M0: 0xFF)."""


def _field_bits(buf: Buffer, a: int, n: int, size: int, code: str, off: int) -> np.ndarray:
    """The codes of one scale field of the `n` blocks of `size` bytes at buf[a:]: a strided view (IQ1_M: its F16
    assembled as ggml_validate_row_data does, from the top nibbles of the block's four uint16 scales)."""
    import numpy as np

    if code == IQ1_M_F16:
        sc = [np.ndarray((n,), "<u2", buf, a + off + 2 * k, (size,)) for k in range(4)]
        return (sc[0] >> 12) | ((sc[1] >> 8) & 0xF0) | ((sc[2] >> 4) & 0xF00) | (sc[3] & 0xF000)
    view = {F16: "<u2", F32: "<u4", E8M0: "u1"}.get(code)
    if view is None:
        raise ValueError(f"no reader of a {code} scale field")
    return np.ndarray((n,), view, buf, a + off, (size,))


def ggml_screen(buf: Buffer, a: int, n: int, dtype: str) -> bool:
    """Whether any scale field of the `n` whole blocks of ggml type `dtype` at buf[a:] is no value: one masked
    max-reduction a field (the usual answer, False, costs no decoding)."""
    t = GGML_BY_NAME[dtype]
    for _name, code, off in t.scales or ():
        bits = _field_bits(buf, a, n, t.size, code, off)
        mask = GGML_NO_VALUE[code]
        if n and int((bits & mask).max()) == mask:
            return True
    return False


def ggml_scales(buf: Buffer, a: int, n: int, dtype: str) -> np.ndarray:
    """The scale fields of the `n` whole blocks of ggml type `dtype` at buf[a:], as float32 [n, fields] (E8M0's
    0xFF as NaN): what ggml_validate_row_data reads of each block, nothing else."""
    import numpy as np

    t = GGML_BY_NAME[dtype]
    fields = t.scales or ()
    out = np.empty((n, len(fields)), np.float32)
    for j, (_name, code, off) in enumerate(fields):
        bits = _field_bits(buf, a, n, t.size, code, off)
        if code == E8M0:
            out[:, j] = np.where(bits == 0xFF, np.float32("nan"), np.ldexp(1.0, bits.astype(np.int32) - 127))
        else:
            out[:, j] = bits.astype("<u4" if code == F32 else "<u2").view("<f4" if code == F32 else "<f2")
    return out


class Scanner:
    """The kernels over one buffer (a worker's reused bytearray, or a window of a memory-mapped file)."""

    def __init__(self, buf: Buffer) -> None:
        self.buf = buf
        self._u8: np.ndarray | None = None

    @property
    def u8(self) -> np.ndarray:
        if self._u8 is None:
            import numpy as np

            self._u8 = np.frombuffer(self.buf, np.uint8)
        return self._u8

    def release(self) -> None:
        """Drop the numpy view (an mmap cannot be closed while one exists)."""
        self._u8 = None

    # ---------------------------------------------------------------- FP8 E4M3

    def count(self, code: bytes, a: int, b: int) -> tuple[int, int]:
        """(how many bytes equal `code` in buf[a:b], the first one's offset from a or -1): stepping from one to
        the next with memchr, or one numpy pass where they are dense."""
        buf = self.buf
        find = buf.find
        i = find(code, a, b)
        if i < 0:
            return 0, -1
        first = i - a
        cap = max(16, (b - a) >> DENSE_SHIFT)
        n = 0
        while i >= 0:
            n += 1
            if n > cap:
                import numpy as np

                return int(np.count_nonzero(self.u8[a:b] == code[0])), first
            i = find(code, i + 1, b)
        return n, first

    def fp8(self, a: int, b: int) -> tuple[int, int, int]:
        """(NaN codes, offset of the first or -1, ±448 values) in buf[a:b]."""
        find = self.buf.find
        i, j = find(b"\x7f", a, b), find(b"\xff", a, b)  # the usual answer: none, two memchr passes
        if i < 0 and j < 0:
            return 0, -1, self._saturated(a, b)
        n1, f1 = self.count(FP8_NAN[0], a, b)
        n2, f2 = self.count(FP8_NAN[1], a, b)
        first = min(f for f in (f1, f2) if f >= 0)
        return n1 + n2, first, self._saturated(a, b)

    def _saturated(self, a: int, b: int) -> int:
        """The bytes 0x7E and 0xFE in buf[a:b]: about two a block in block-quantized weights, found with memchr;
        where they are dense (other data), one numpy pass counts both."""
        find = self.buf.find
        cap = max(16, (b - a) >> DENSE_SHIFT)
        n = 0
        for code in FP8_MAX:
            i = find(code, a, b)
            while i >= 0:
                n += 1
                if n > cap:
                    import numpy as np

                    return int(np.count_nonzero((self.u8[a:b] | 0x80) == 0xFE))
                i = find(code, i + 1, b)
        return n

    def zero_run(self, width: int, a: int, b: int) -> int:
        """Where the first run of `width` 0x00 bytes starts in buf[a:b], or -1 (the all-zero block screen:
        a zeroed block is 0x00 bytes, `width` the narrowest block of the weight). Zero bytes are rare in
        quantized weights: each one is found with memchr and its run looked at; where they are frequent, one
        search for the whole run takes over."""
        buf = self.buf
        run = ZEROS[:width]
        i = buf.find(b"\x00", a, b)
        hits = 0
        while 0 <= i <= b - width:
            if buf[i:i + width] == run:
                return i
            hits += 1
            if hits > 16:
                return buf.find(run, i + 1, b)
            i = buf.find(b"\x00", i + 1, b)
        return -1

    def zero_blocks(self, a: int, rows: int, cols: int, block: tuple[int, int]) -> tuple[int, int]:
        """All-zero blocks (+0 and -0) among the `rows` x `cols` FP8 values at buf[a:], `rows` at most one block
        high: (how many, the first one's column-block index or -1)."""
        import numpy as np

        band = self.u8[a:a + rows * cols].reshape(rows, cols)
        nonzero = ((band & 0x7F) != 0).any(axis=0)
        has_value = np.logical_or.reduceat(nonzero, np.arange(0, cols, block[1]))
        empty = np.flatnonzero(~has_value)
        return int(empty.size), int(empty[0]) if empty.size else -1

    # ---------------------------------------------------------------- byte-coded scales

    def e8m0(self, a: int, b: int) -> tuple[int, int]:
        """(NaN codes, the first one's offset or -1) among E8M0 scales (F8_E8M0, or MX formats' U8 exponents) in
        buf[a:b]: 0xFF is NaN; every other code is a positive power of two."""
        return self.count(b"\xff", a, b)

    def fp8_scales(self, a: int, b: int) -> tuple[int, int, int, int]:
        """(NaN codes, first or -1, scales <= 0, first or -1) among F8_E4M3 scales (NVFP4's) in buf[a:b]: NaN is
        0x7F / 0xFF; zero is 0x00 / 0x80, and a set sign bit is negative."""
        import numpy as np

        u = self.u8[a:b]
        nan = np.flatnonzero((u & 0x7F) == 0x7F)
        bad = np.flatnonzero(((u & 0x7F) == 0) | ((u & 0x80) != 0) & ((u & 0x7F) != 0x7F))
        return (int(nan.size), int(nan[0]) if nan.size else -1, int(bad.size), int(bad[0]) if bad.size else -1)

    def ggml(self, a: int, b: int, dtype: str) -> tuple[int, int, int, int]:
        """(NaN scales, the first one's block or -1, ±Inf scales, first or -1) among the scale fields of the whole
        blocks of ggml type `dtype` at buf[a:b]."""
        import numpy as np

        n = (b - a) // GGML_BY_NAME[dtype].size
        if not ggml_screen(self.buf, a, n, dtype):
            return 0, -1, 0, -1
        values = ggml_scales(self.buf, a, n, dtype)
        nan = np.flatnonzero(np.isnan(values).any(axis=1))
        inf = np.flatnonzero(np.isinf(values).any(axis=1))
        return (int(np.count_nonzero(np.isnan(values))), int(nan[0]) if nan.size else -1,
                int(np.count_nonzero(np.isinf(values))), int(inf[0]) if inf.size else -1)

    # ---------------------------------------------------------------- BF16 / F16 / F32

    def _bits(self, a: int, b: int, dtype: str) -> np.ndarray:
        import numpy as np

        return np.frombuffer(self.buf, FLOAT_BITS[dtype][0], count=(b - a) * 8 // DTYPE_BITS[dtype], offset=a)

    def floats(self, a: int, b: int, dtype: str) -> tuple[int, int, int, int]:
        """(NaN, first NaN or -1, ±Inf, first Inf or -1) among the values at buf[a:b]."""
        import numpy as np

        if dtype in FNUZ_DTYPES:
            nan_at = np.flatnonzero(self.u8[a:b] == 0x80)
            return int(nan_at.size), int(nan_at[0]) if nan_at.size else -1, 0, -1
        _view, exp, mag = FLOAT_BITS[dtype]
        bits = self._bits(a, b, dtype)
        m = bits & bits.dtype.type(mag)
        if not m.size or int(m.max()) < exp:
            return 0, -1, 0, -1
        nan_at = np.flatnonzero(m > exp)
        inf_at = np.flatnonzero(m == exp)
        return (int(nan_at.size), int(nan_at[0]) if nan_at.size else -1,
                int(inf_at.size), int(inf_at[0]) if inf_at.size else -1)

    def scales(self, a: int, b: int, dtype: str) -> tuple[int, int, int, int, int, int, float | None, float | None]:
        """`floats` plus (scales <= 0, first or -1): scales must be finite and > 0; and the least and greatest
        finite scale (None, None where there is none), for the report's scale ranges."""
        import numpy as np

        nan, nan_first, inf, inf_first = self.floats(a, b, dtype)
        values: np.ndarray
        if dtype in ("F32", "F64", "F16"):
            values = self._bits(a, b, dtype).view({"F32": np.float32, "F64": np.float64, "F16": np.float16}[dtype])
        elif dtype == "BF16":
            values = (self._bits(a, b, dtype).astype(np.uint32) << 16).view(np.float32)
        else:  # the FP8 types: through ml_dtypes
            from kimi_audit.numerics.dtypes import numpy_dtype

            values = self.u8[a:b].view(numpy_dtype(dtype)).astype(np.float32)
        bad = np.flatnonzero(values <= 0)  # NaN compares False: counted as NaN only
        finite = values if not (nan or inf) else values[np.isfinite(values)]
        lo, hi = (float(finite.min()), float(finite.max())) if finite.size else (None, None)
        return nan, nan_first, inf, inf_first, int(bad.size), int(bad[0]) if bad.size else -1, lo, hi
