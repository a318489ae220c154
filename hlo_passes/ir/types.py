"""HLO element types (XLA's PrimitiveType), with sizes and numpy dtypes."""

from __future__ import annotations

import enum
from typing import TYPE_CHECKING, cast

if TYPE_CHECKING:
    import numpy as np


class PrimitiveType(enum.Enum):
    """An element type as spelled in HLO text (`f32`, `pred`, `token`, ...)."""

    PRED = "pred"
    S1 = "s1"
    S2 = "s2"
    S4 = "s4"
    S8 = "s8"
    S16 = "s16"
    S32 = "s32"
    S64 = "s64"
    U1 = "u1"
    U2 = "u2"
    U4 = "u4"
    U8 = "u8"
    U16 = "u16"
    U32 = "u32"
    U64 = "u64"
    F4E2M1FN = "f4e2m1fn"
    F8E3M4 = "f8e3m4"
    F8E4M3 = "f8e4m3"
    F8E4M3FN = "f8e4m3fn"
    F8E4M3B11FNUZ = "f8e4m3b11fnuz"
    F8E4M3FNUZ = "f8e4m3fnuz"
    F8E5M2 = "f8e5m2"
    F8E5M2FNUZ = "f8e5m2fnuz"
    F8E8M0FNU = "f8e8m0fnu"
    BF16 = "bf16"
    F16 = "f16"
    F32 = "f32"
    F64 = "f64"
    C64 = "c64"
    C128 = "c128"
    TOKEN = "token"
    OPAQUE = "opaque"

    # By identity, in C (Enum's own hashes the name in Python): shapes, and so the element
    # types, are hashed as cache keys by the partitioner.  See Opcode.
    __hash__ = object.__hash__

    @property
    def bit_width(self) -> int:
        return _BIT_WIDTH[self]

    @property
    def byte_size(self) -> int:
        """Bytes per element as XLA counts them for dense arrays (sub-byte types round up)."""
        return max(1, self.bit_width // 8)

    @property
    def is_float(self) -> bool:
        return self.value.startswith(("f", "bf"))

    @property
    def is_complex(self) -> bool:
        return self.value.startswith("c")

    @property
    def is_integer(self) -> bool:
        return self.value.startswith(("s", "u"))

    @property
    def is_signed_integer(self) -> bool:
        return self.value.startswith("s")

    @property
    def is_array(self) -> bool:
        return self not in (PrimitiveType.TOKEN, PrimitiveType.OPAQUE)

    def numpy_dtype(self) -> np.dtype:
        """The numpy dtype holding values of this type (ml_dtypes for bf16, f8, f4, int1/int2/int4)."""
        import numpy as np  # deferred: commands that never build arrays start without numpy

        if self in _NUMPY_NAMES:
            return np.dtype(_NUMPY_NAMES[self])
        import ml_dtypes

        return cast("np.dtype", np.dtype(getattr(ml_dtypes, _ML_DTYPES_NAMES[self])))


_BIT_WIDTH = {
    PrimitiveType.PRED: 8,
    PrimitiveType.S1: 1, PrimitiveType.U1: 1,
    PrimitiveType.S2: 2, PrimitiveType.U2: 2,
    PrimitiveType.S4: 4, PrimitiveType.U4: 4, PrimitiveType.F4E2M1FN: 4,
    PrimitiveType.S8: 8, PrimitiveType.U8: 8,
    PrimitiveType.F8E3M4: 8, PrimitiveType.F8E4M3: 8, PrimitiveType.F8E4M3FN: 8,
    PrimitiveType.F8E4M3B11FNUZ: 8, PrimitiveType.F8E4M3FNUZ: 8, PrimitiveType.F8E5M2: 8,
    PrimitiveType.F8E5M2FNUZ: 8, PrimitiveType.F8E8M0FNU: 8,
    PrimitiveType.S16: 16, PrimitiveType.U16: 16, PrimitiveType.BF16: 16, PrimitiveType.F16: 16,
    PrimitiveType.S32: 32, PrimitiveType.U32: 32, PrimitiveType.F32: 32,
    PrimitiveType.S64: 64, PrimitiveType.U64: 64, PrimitiveType.F64: 64, PrimitiveType.C64: 64,
    PrimitiveType.C128: 128,
    PrimitiveType.TOKEN: 0, PrimitiveType.OPAQUE: 0,
}

_NUMPY_NAMES = {
    PrimitiveType.PRED: "bool",
    PrimitiveType.S8: "int8", PrimitiveType.S16: "int16", PrimitiveType.S32: "int32",
    PrimitiveType.S64: "int64",
    PrimitiveType.U8: "uint8", PrimitiveType.U16: "uint16", PrimitiveType.U32: "uint32",
    PrimitiveType.U64: "uint64",
    PrimitiveType.F16: "float16", PrimitiveType.F32: "float32", PrimitiveType.F64: "float64",
    PrimitiveType.C64: "complex64", PrimitiveType.C128: "complex128",
}

_ML_DTYPES_NAMES = {
    PrimitiveType.BF16: "bfloat16",
    PrimitiveType.S1: "int1", PrimitiveType.U1: "uint1",
    PrimitiveType.S2: "int2", PrimitiveType.U2: "uint2",
    PrimitiveType.S4: "int4", PrimitiveType.U4: "uint4",
    PrimitiveType.F4E2M1FN: "float4_e2m1fn",
    PrimitiveType.F8E3M4: "float8_e3m4", PrimitiveType.F8E4M3: "float8_e4m3",
    PrimitiveType.F8E4M3FN: "float8_e4m3fn", PrimitiveType.F8E4M3B11FNUZ: "float8_e4m3b11fnuz",
    PrimitiveType.F8E4M3FNUZ: "float8_e4m3fnuz", PrimitiveType.F8E5M2: "float8_e5m2",
    PrimitiveType.F8E5M2FNUZ: "float8_e5m2fnuz", PrimitiveType.F8E8M0FNU: "float8_e8m0fnu",
}

PRIMITIVE_TYPES_BY_NAME = {t.value: t for t in PrimitiveType}
