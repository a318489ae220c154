"""A seeded mutator over real HLO text, for the fuzz test (test_fuzz.py).

    mutants(seeds, count, seed) -> [(description, text), ...]

Each mutant is one of the seeds changed by one or two operations: truncation,
deletion of a span or a line, duplication, a changed character, two tokens swapped,
a number made huge, negative or oddly spelled, operands or shapes nested deep, an
attribute added, misspelled or dropped, an opcode changed, a line moved above its
operands.  The same seed gives the same mutants.
"""

from __future__ import annotations

import random
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

_TOKEN = re.compile(r'"(?:[^"\\]|\\.)*"|[A-Za-z_%][\w.\-]*|-?\d+(?:\.\d+)?|\S')
_NUMBER = re.compile(r"(?<![\w.])-?\d+(?![\w.])")
_ATTRIBUTE = re.compile(r", ([a-z_\-]+)=")
_OPCODE = re.compile(r"= (\S+ )?([a-z][a-z0-9\-]*)\(")
_CHARS = "{}[]()<>,=%:\"'#*-_.? \t\n\r\\/x0123456789"
_HUGE = ["99999999999999999999", "9223372036854775807", "9223372036854775808", "-1", "-9223372036854775809",
         "4294967296", "1_000", "0x10", "1e400", "\u0663", "7" * 4300, "2147483648", "0"]
_ATTRIBUTES = ["dimensions={0}", "index=1", "to_apply=%nowhere", "foo=1", "sharding={replicated}",
               "sharding={devices=[2147483648]<=[2147483648]}", "replica_groups=[1000000000,1]<=[1000000000]",
               "metadata={op_name=\"x\" bogus=1}", "channel_id=-3", "slice={[0:1:0]}", "window={size=0}",
               "control-predecessors={%nowhere}", "backend_config=unquoted", "padding=1_1_1_1",
               "frontend_attributes={a=\"b\"}", "iota_dimension=99", "feature_group_count=0",
               "operand_layout_constraints={f32[1]{0}}", "api_version=API_VERSION_UNSPECIFIED",
               "result_accuracy={mode=highest}", "dim_labels=b0f_0io->b0f", "k=-1", "calls=%e"]
_OPCODES = ["add", "negate", "tuple", "get-tuple-element", "reduce", "broadcast", "reshape", "transpose",
            "dot", "convolution", "custom-call", "all-reduce", "while", "conditional", "call", "fusion",
            "sort", "gather", "scatter", "pad", "slice", "concatenate", "iota", "constant", "parameter",
            "async-start", "async-done", "custom-call-start", "add-start", "copy-start", "send", "recv",
            "infeed", "after-all", "rng", "reduce-window", "select-and-scatter", "bitcast", "addd", "negat"]


def seed_texts(max_bytes: int = 60_000) -> list[tuple[str, str]]:
    """(name, text) of every small HLO file of the repository and every syntax case."""
    from tests.frontend.syntax_cases import CASES

    seeds = [(f"syntax:{name}", text) for name, (_, text) in sorted(CASES.items())]
    files = sorted((ROOT / "golden").rglob("*.hlo")) + sorted((ROOT / "examples").glob("*.hlo"))
    for path in files:
        if path.stat().st_size <= max_bytes:
            seeds.append((str(path.relative_to(ROOT)), path.read_text()))
    return seeds


class Mutator:
    def __init__(self, rng: random.Random):
        self.rng = rng

    # Each operation takes the text and returns (what it did, new text).
    def truncate(self, t: str):
        at = self.rng.randrange(len(t) + 1)
        return f"truncate at {at}", t[:at]

    def delete_span(self, t: str):
        at = self.rng.randrange(len(t) + 1)
        n = self.rng.randint(1, 40)
        return f"delete {n} at {at}", t[:at] + t[at + n:]

    def delete_line(self, t: str):
        lines = t.split("\n")
        i = self.rng.randrange(len(lines))
        return f"delete line {i + 1}", "\n".join(lines[:i] + lines[i + 1:])

    def duplicate(self, t: str):
        lines = t.split("\n")
        i = self.rng.randrange(len(lines))
        j = self.rng.randrange(len(lines) + 1)
        return f"copy line {i + 1} to {j + 1}", "\n".join(lines[:j] + [lines[i]] + lines[j:])

    def move_line_up(self, t: str):
        lines = t.split("\n")
        if len(lines) < 3:
            return self.duplicate(t)
        i = self.rng.randrange(1, len(lines))
        j = self.rng.randrange(0, i)
        line = lines.pop(i)
        return f"move line {i + 1} to {j + 1}", "\n".join(lines[:j] + [line] + lines[j:])

    def change_char(self, t: str):
        if not t:
            return "empty", t
        at = self.rng.randrange(len(t))
        c = self.rng.choice(_CHARS)
        return f"char {at} -> {c!r}", t[:at] + c + t[at + 1:]

    def swap_tokens(self, t: str):
        toks = list(_TOKEN.finditer(t))
        if len(toks) < 2:
            return self.change_char(t)
        a, b = sorted(self.rng.sample(range(len(toks)), 2))
        ta, tb = toks[a], toks[b]
        new = t[:ta.start()] + tb.group() + t[ta.end():tb.start()] + ta.group() + t[tb.end():]
        return f"swap {ta.group()!r} and {tb.group()!r}", new

    def huge_number(self, t: str):
        nums = list(_NUMBER.finditer(t))
        if not nums:
            return self.change_char(t)
        m = self.rng.choice(nums)
        value = self.rng.choice(_HUGE)
        return f"number {m.group()!r} -> {value[:20]!r}", t[:m.start()] + value + t[m.end():]

    def deep_nesting(self, t: str):
        depth = self.rng.choice([50, 300, 1200, 5000])
        if self.rng.random() < 0.5:
            m = re.search(r"\b(f32|s32|pred|bf16)\[[^\]]*\]", t)
            if m:
                return (f"shape nested {depth} deep",
                        t[:m.start()] + "(" * depth + m.group() + ")" * depth + t[m.end():])
        m = re.search(r"\(([%\w.\-]+)[,)]", t)
        if not m:
            return self.change_char(t)
        name = m.group(1)
        wrapped = "negate(" * depth + name + ")" * depth
        return f"operand nested {depth} deep", t[:m.start(1)] + wrapped + t[m.end(1):]

    def add_attribute(self, t: str):
        lines = t.split("\n")
        candidates = [i for i, line in enumerate(lines) if "=" in line and "(" in line and line.strip()]
        if not candidates:
            return self.change_char(t)
        i = self.rng.choice(candidates)
        attr = self.rng.choice(_ATTRIBUTES)
        lines[i] = lines[i].rstrip() + ", " + attr
        return f"line {i + 1} += {attr}", "\n".join(lines)

    def misspell_attribute(self, t: str):
        found = list(_ATTRIBUTE.finditer(t))
        if not found:
            return self.add_attribute(t)
        m = self.rng.choice(found)
        key = m.group(1)
        if len(key) > 2 and self.rng.random() < 0.5:
            k = self.rng.randrange(len(key))
            new = key[:k] + key[k + 1:]
        else:
            new = self.rng.choice(["dimension", "index", "to_apply", "kind", "calls", "body", "window"])
        return f"attribute {key} -> {new}", t[:m.start(1)] + new + t[m.end(1):]

    def change_opcode(self, t: str):
        found = list(_OPCODE.finditer(t))
        if not found:
            return self.change_char(t)
        m = self.rng.choice(found)
        new = self.rng.choice(_OPCODES)
        return f"opcode {m.group(2)} -> {new}", t[:m.start(2)] + new + t[m.end(2):]

    def drop_shape(self, t: str):
        m = list(re.finditer(r"= ([a-z0-9]+\[[^\]]*\](?:\{[^}]*\})?|\([^=]*?\)) ([a-z])", t))
        if not m:
            return self.change_char(t)
        pick = self.rng.choice(m)
        return "drop a result shape", t[:pick.start(1)] + t[pick.end(1) + 1:]

    def operations(self):
        return [self.truncate, self.delete_span, self.delete_line, self.duplicate, self.move_line_up,
                self.change_char, self.swap_tokens, self.huge_number, self.deep_nesting, self.add_attribute,
                self.misspell_attribute, self.change_opcode, self.drop_shape]


def mutants(seeds: list[tuple[str, str]], count: int, seed: int) -> list[tuple[str, str]]:
    rng = random.Random(seed)
    mutator = Mutator(rng)
    ops = mutator.operations()
    out = []
    for i in range(count):
        name, text = seeds[rng.randrange(len(seeds))]
        steps = []
        for _ in range(1 if rng.random() < 0.7 else 2):
            what, text = rng.choice(ops)(text)
            steps.append(what)
        out.append((f"#{i} {name}: {'; '.join(steps)}", text))
    return out
