"""HLO opcodes and their traits.

Traits are declared here, per opcode, so that cleanup passes (DCE, CSE) and the
partitioner read one table instead of guessing: a collective or a side-effecting
op is never dropped or merged.
"""

from __future__ import annotations

import enum


class Opcode(enum.Enum):
    ABS = "abs"
    ACOS = "acos"
    ACOSH = "acosh"
    ADD = "add"
    ADD_DEPENDENCY = "add-dependency"
    AFTER_ALL = "after-all"
    ALL_GATHER = "all-gather"
    ALL_GATHER_DONE = "all-gather-done"
    ALL_GATHER_START = "all-gather-start"
    ALL_REDUCE = "all-reduce"
    ALL_REDUCE_DONE = "all-reduce-done"
    ALL_REDUCE_START = "all-reduce-start"
    ALL_TO_ALL = "all-to-all"
    AND = "and"
    ASIN = "asin"
    ASINH = "asinh"
    ASYNC_DONE = "async-done"
    ASYNC_START = "async-start"
    ASYNC_UPDATE = "async-update"
    ATAN2 = "atan2"
    ATANH = "atanh"
    BATCH_NORM_GRAD = "batch-norm-grad"
    BATCH_NORM_INFERENCE = "batch-norm-inference"
    BATCH_NORM_TRAINING = "batch-norm-training"
    BITCAST = "bitcast"
    BITCAST_CONVERT = "bitcast-convert"
    BROADCAST = "broadcast"
    CALL = "call"
    CBRT = "cbrt"
    CEIL = "ceil"
    CHOLESKY = "cholesky"
    CLAMP = "clamp"
    CLZ = "count-leading-zeros"
    COLLECTIVE_BROADCAST = "collective-broadcast"
    COLLECTIVE_PERMUTE = "collective-permute"
    COLLECTIVE_PERMUTE_DONE = "collective-permute-done"
    COLLECTIVE_PERMUTE_START = "collective-permute-start"
    COLLECTIVE_REDUCE = "collective-reduce"
    COMPARE = "compare"
    COMPLEX = "complex"
    CONCATENATE = "concatenate"
    CONDITIONAL = "conditional"
    CONSTANT = "constant"
    CONVERT = "convert"
    CONVOLUTION = "convolution"
    COPY = "copy"
    COPY_DONE = "copy-done"
    COPY_START = "copy-start"
    COS = "cosine"
    COSH = "cosh"
    CUSTOM_CALL = "custom-call"
    DIVIDE = "divide"
    DOMAIN = "domain"
    DOT = "dot"
    DYNAMIC_RESHAPE = "dynamic-reshape"
    DYNAMIC_SLICE = "dynamic-slice"
    DYNAMIC_UPDATE_SLICE = "dynamic-update-slice"
    ERF = "erf"
    EXP = "exponential"
    EXPM1 = "exponential-minus-one"
    FFT = "fft"
    FLOOR = "floor"
    FUSION = "fusion"
    GATHER = "gather"
    GET_DIMENSION_SIZE = "get-dimension-size"
    GET_TUPLE_ELEMENT = "get-tuple-element"
    IMAG = "imag"
    INFEED = "infeed"
    IOTA = "iota"
    IS_FINITE = "is-finite"
    LOG = "log"
    LOG1P = "log-plus-one"
    LOGISTIC = "logistic"
    MAP = "map"
    MAXIMUM = "maximum"
    MINIMUM = "minimum"
    MULHI = "mulhi"
    MULTIPLY = "multiply"
    NEGATE = "negate"
    NOT = "not"
    OPTIMIZATION_BARRIER = "opt-barrier"
    OR = "or"
    OUTFEED = "outfeed"
    PAD = "pad"
    PARAMETER = "parameter"
    PARTITION_ID = "partition-id"
    POPCNT = "popcnt"
    POWER = "power"
    RAGGED_ALL_TO_ALL = "ragged-all-to-all"
    RAGGED_DOT = "ragged-dot"
    REAL = "real"
    RECV = "recv"
    RECV_DONE = "recv-done"
    REDUCE = "reduce"
    REDUCE_PRECISION = "reduce-precision"
    REDUCE_SCATTER = "reduce-scatter"
    REDUCE_WINDOW = "reduce-window"
    REMAINDER = "remainder"
    REPLICA_ID = "replica-id"
    RESHAPE = "reshape"
    REVERSE = "reverse"
    RNG = "rng"
    RNG_BIT_GENERATOR = "rng-bit-generator"
    RNG_GET_AND_UPDATE_STATE = "rng-get-and-update-state"
    ROUND_NEAREST_AFZ = "round-nearest-afz"
    ROUND_NEAREST_EVEN = "round-nearest-even"
    RSQRT = "rsqrt"
    SCALED_DOT = "scaled-dot"
    SCAN = "scan"
    SCATTER = "scatter"
    SELECT = "select"
    SELECT_AND_SCATTER = "select-and-scatter"
    SEND = "send"
    SEND_DONE = "send-done"
    SET_DIMENSION_SIZE = "set-dimension-size"
    SHIFT_LEFT = "shift-left"
    SHIFT_RIGHT_ARITHMETIC = "shift-right-arithmetic"
    SHIFT_RIGHT_LOGICAL = "shift-right-logical"
    SHUFFLE = "shuffle"
    SIGN = "sign"
    SIN = "sine"
    SINH = "sinh"
    SLICE = "slice"
    SORT = "sort"
    SQRT = "sqrt"
    STOCHASTIC_CONVERT = "stochastic-convert"
    SUBTRACT = "subtract"
    TAN = "tan"
    TANH = "tanh"
    TOPK = "topk"
    TRANSPOSE = "transpose"
    TRIANGULAR_SOLVE = "triangular-solve"
    TUPLE = "tuple"
    WHILE = "while"
    XOR = "xor"

    # Enum hashes a member by its name in Python code; opcodes are looked up in the trait sets
    # below (and in the propagation and partitioning rule tables) millions of times on a big
    # module, so they hash by identity, in C.  Members are singletons, so equal members still
    # hash alike; what changes is only the (already per-process) iteration order of the sets.
    __hash__ = object.__hash__

    # ------------------------------------------------------------- traits --
    @property
    def is_elementwise_unary(self) -> bool:
        return self in ELEMENTWISE_UNARY

    @property
    def is_elementwise_binary(self) -> bool:
        return self in ELEMENTWISE_BINARY

    @property
    def is_commutative(self) -> bool:
        """op(a, b) == op(b, a) for every a, b (XLA's HloOpcodeIsBinaryCommutative)."""
        return self in COMMUTATIVE_BINARY

    @property
    def is_elementwise(self) -> bool:
        return self in ELEMENTWISE_UNARY or self in ELEMENTWISE_BINARY or self in ELEMENTWISE_TERNARY

    @property
    def is_collective(self) -> bool:
        return self in COLLECTIVES

    @property
    def has_side_effect(self) -> bool:
        """Never removed or merged even without users (custom-calls are judged per instruction)."""
        return self in SIDE_EFFECTING


OPCODES_BY_NAME = {op.value: op for op in Opcode}

ELEMENTWISE_UNARY = frozenset({
    Opcode.ABS, Opcode.CBRT, Opcode.CEIL, Opcode.CLZ, Opcode.CONVERT, Opcode.COPY, Opcode.COS,
    Opcode.ERF, Opcode.EXP, Opcode.EXPM1, Opcode.FLOOR, Opcode.IMAG, Opcode.IS_FINITE, Opcode.LOG,
    Opcode.LOG1P, Opcode.LOGISTIC, Opcode.NEGATE, Opcode.NOT, Opcode.POPCNT, Opcode.REAL,
    Opcode.REDUCE_PRECISION, Opcode.ROUND_NEAREST_AFZ, Opcode.ROUND_NEAREST_EVEN, Opcode.RSQRT,
    Opcode.SIGN, Opcode.SIN, Opcode.SQRT, Opcode.TAN, Opcode.TANH, Opcode.BITCAST_CONVERT,
    Opcode.ACOS, Opcode.ACOSH, Opcode.ASIN, Opcode.ASINH, Opcode.ATANH, Opcode.COSH, Opcode.SINH,
})
ELEMENTWISE_BINARY = frozenset({
    Opcode.ADD, Opcode.AND, Opcode.ATAN2, Opcode.COMPARE, Opcode.COMPLEX, Opcode.DIVIDE,
    Opcode.MAXIMUM, Opcode.MINIMUM, Opcode.MULTIPLY, Opcode.OR, Opcode.POWER, Opcode.REMAINDER,
    Opcode.SHIFT_LEFT, Opcode.SHIFT_RIGHT_ARITHMETIC, Opcode.SHIFT_RIGHT_LOGICAL, Opcode.SUBTRACT,
    Opcode.XOR, Opcode.STOCHASTIC_CONVERT, Opcode.MULHI,
})
ELEMENTWISE_TERNARY = frozenset({Opcode.SELECT, Opcode.CLAMP})
COMMUTATIVE_BINARY = frozenset({
    Opcode.ADD, Opcode.MULTIPLY, Opcode.MULHI, Opcode.MAXIMUM, Opcode.MINIMUM, Opcode.AND, Opcode.OR, Opcode.XOR,
})

COLLECTIVES = frozenset({
    Opcode.ALL_GATHER, Opcode.ALL_GATHER_START, Opcode.ALL_GATHER_DONE, Opcode.ALL_REDUCE,
    Opcode.ALL_REDUCE_START, Opcode.ALL_REDUCE_DONE, Opcode.ALL_TO_ALL, Opcode.RAGGED_ALL_TO_ALL,
    Opcode.COLLECTIVE_BROADCAST, Opcode.COLLECTIVE_PERMUTE, Opcode.COLLECTIVE_PERMUTE_START,
    Opcode.COLLECTIVE_PERMUTE_DONE, Opcode.REDUCE_SCATTER, Opcode.COLLECTIVE_REDUCE,
})

SIDE_EFFECTING = COLLECTIVES | frozenset({
    Opcode.AFTER_ALL, Opcode.ADD_DEPENDENCY, Opcode.INFEED, Opcode.OUTFEED, Opcode.SEND,
    Opcode.SEND_DONE, Opcode.RECV, Opcode.RECV_DONE, Opcode.RNG, Opcode.RNG_GET_AND_UPDATE_STATE,
    Opcode.ASYNC_START, Opcode.ASYNC_UPDATE, Opcode.ASYNC_DONE, Opcode.OPTIMIZATION_BARRIER,
    Opcode.DOMAIN, Opcode.COPY_START, Opcode.COPY_DONE,
})
