"""Parsing is reentrant: each parse has its own builder (and, on the grammar path, its own
grammar callbacks), and attribute values are read on first use by readers that share nothing
but thread-safe caches of pure functions.  The JAX hook runs pipelines on several threads, so
several threads parse different modules and read their attributes at once here; every result
must equal the one-thread result.

Guards the shared attribute reader of old (`_BUILDER.raw` set before each read): a sharding's
`metadata={...}` or a frontend attribute's `{...}` value, sliced from another thread's text,
came out wrong or failed to read."""

import concurrent.futures
import sys

import pytest

from hlo_passes import parse_module, print_module
from hlo_passes.parse import attribute_reader, shapes
from hlo_passes.parse.errors import HloParseError

LAYERS = 60
MODULES = 12


def _module_text(k: int) -> str:
    """A module whose attribute texts are its own (so reads are not answered by the shared caches
    filled by another module), with a nested operand (a line the scanner hands to the grammar)."""
    lines = [f"HloModule m{k}, num_partitions=2", "", "ENTRY e {",
             "  p0 = f32[8,16]{1,0} parameter(0), sharding={replicated}"]
    prev = "p0"
    for i in range(LAYERS):
        lines += [
            f"  a{i} = f32[8,16]{{1,0}} add({prev}, {prev}), "
            f"sharding={{devices=[2,1]<=[2] metadata={{op_name=\"m{k}/a{i}\"}}}}, "
            f"metadata={{op_name=\"m{k}/add{i}\" source_line={k * 1000 + i}}}, "
            f"frontend_attributes={{tag={{k{k}_{i}}}, name=\"v{k}_{i}\"}}",
            f"  t{i} = f32[16,8]{{1,0}} transpose(a{i}), dimensions={{1,0}}, "
            f"sharding={{devices=[1,2]0,1 metadata={{op_name=\"m{k}/t{i}\"}}}}",
            f"  b{i} = f32[8,16]{{1,0}} transpose(t{i}), dimensions={{1,0}}",
        ]
        prev = f"b{i}"
    lines.append(f"  ROOT r = f32[8,16]{{1,0}} add({prev}, negate({prev})), "
                 f"sharding={{devices=[2,1]0,1 metadata={{op_name=\"m{k}/root\"}}}}")
    return "\n".join(lines + ["}", ""])


def _broken_text(k: int) -> str:
    """A module with an error on line `5 + k` (an undefined operand)."""
    body = [f"  a{i} = f32[4] negate(p)" for i in range(k)]
    return "\n".join(["HloModule bad", "", "ENTRY e {", "  p = f32[4] parameter(0)", *body,
                      f"  ROOT r = f32[4] add(p, missing{k})", "}", ""])


def _read_all(module) -> tuple:
    """Everything a pass may read of the module: typed attribute values (read first, one after
    the other, so that reads on different threads overlap), spans, the printed text."""
    instructions = [i for comp in module.computations for i in comp.instructions]
    values = [(i.sharding, i.attr("frontend_attributes"), i.metadata, i.dimensions) for i in instructions]
    seen = [(comp.name, comp.span) for comp in module.computations]
    for instr, (sharding, frontend, metadata, dimensions) in zip(instructions, values):
        seen.append((instr.name, instr.span, sharding.to_hlo() if sharding is not None else None,
                     sharding.metadata if sharding is not None else None, frontend, metadata, dimensions))
    return print_module(module), tuple(seen)


def _parse(k: int, engine: str):
    """Module k, or the error of broken module -k."""
    if k < 0:
        try:
            parse_module(_broken_text(-k), f"bad{-k}.hlo", engine=engine)
        except HloParseError as e:
            return e.filename, e.line, e.column, e.message
        raise AssertionError("the broken module parsed")
    return parse_module(_module_text(k), f"m{k}.hlo", engine=engine)


def _read(parsed) -> tuple:
    return parsed if isinstance(parsed, tuple) else _read_all(parsed)


def _clear_shared_caches() -> None:
    """Empty the caches parses share, so that the next reads are done again, not looked up."""
    for reader in attribute_reader.READERS.values():
        clear = getattr(reader, "cache_clear", None)
        if clear is not None:
            clear()
    shapes.parse_shape.cache_clear()


@pytest.fixture
def frequent_thread_switches():
    """Switch threads every few microseconds (CPython's default is 5 ms), so that parses and
    reads interleave finely."""
    old = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)
    yield
    sys.setswitchinterval(old)


def test_parses_and_attribute_reads_on_many_threads_equal_one_thread(frequent_thread_switches):
    jobs = [(k, engine) for k in range(MODULES) for engine in ("auto", "lark")]
    jobs += [(-k, engine) for k in range(1, 4) for engine in ("auto", "lark")]
    _clear_shared_caches()
    with concurrent.futures.ThreadPoolExecutor(max_workers=8) as pool:
        parsed = list(pool.map(lambda job: _parse(*job), jobs))
        # Reads after all parses, all at once (a read is a few microseconds: reads interleaved
        # with parses would seldom overlap), and read again, not looked up (the parser's checks
        # of the values filled the readers' caches).
        _clear_shared_caches()
        together = list(pool.map(_read, parsed))
    _clear_shared_caches()
    alone = [_read(_parse(*job)) for job in jobs]
    for job, got, expected in zip(jobs, together, alone):
        assert got == expected, f"module {job} read on several threads differs from one thread"
    # The modules really differ, and the error is where it is.
    assert len({text for text, _ in together[:MODULES * 2]}) == MODULES
    assert together[-1][:3] == ("bad3.hlo", 8, 26)


def test_one_module_read_by_many_threads_at_once(frequent_thread_switches):
    """Attributes of one module read lazily by several threads at once (a slot's first read
    may run twice; both give the same value)."""
    module = parse_module(_module_text(99), "m99.hlo")
    _clear_shared_caches()
    with concurrent.futures.ThreadPoolExecutor(max_workers=8) as pool:
        reads = list(pool.map(lambda _: _read_all(module), range(8)))
    _clear_shared_caches()
    expected = _read_all(parse_module(_module_text(99), "m99.hlo"))
    assert all(r == expected for r in reads)
