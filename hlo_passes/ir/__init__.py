"""The HLO IR: modules, computations, instructions and the values they carry."""

from hlo_passes.ir.attributes import (Attr, ConvDimensionLabels, FrontendAttributes, OpMetadata,
                                      PaddingConfig, ShapeList, SliceSpec, Window, WindowDimension)
from hlo_passes.ir.computation import Computation, IRError
from hlo_passes.ir.instruction import Instruction
from hlo_passes.ir.module import DebugTables, Module
from hlo_passes.ir.opcode import Opcode
from hlo_passes.ir.replica_groups import ReplicaGroups
from hlo_passes.ir.shape import ArrayShape, Layout, Shape, TupleShape, scalar
from hlo_passes.ir.sharding import IotaDevices, Sharding, ShardingKind, SubgroupKind
from hlo_passes.ir.source import SourceSpan
from hlo_passes.ir.types import PrimitiveType

__all__ = [
    "Attr", "ArrayShape", "Computation", "ConvDimensionLabels", "DebugTables", "FrontendAttributes",
    "IRError", "Instruction", "IotaDevices", "Layout", "Module", "OpMetadata", "Opcode",
    "PaddingConfig", "PrimitiveType", "ReplicaGroups", "Shape", "Sharding", "ShardingKind",
    "ShapeList", "SliceSpec", "SourceSpan", "SubgroupKind", "TupleShape", "Window", "WindowDimension", "scalar",
]
