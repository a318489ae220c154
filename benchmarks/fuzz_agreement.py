"""How often our parser and XLA's agree on mutants of real HLO (tests/frontend/fuzz.py).

    python benchmarks/fuzz_agreement.py [--count 2000] [--seed 0] [--show 20]

Each mutant is read by hlo_passes and by XLA's parser (in a worker process, restarted
past any mutant that crashes XLA).  The table counts the four outcomes; "we accept, XLA
rejects" is the number that matters (invalid modules reaching the passes); "we reject,
XLA accepts" is mostly the verifier's shape rules (XLA's parser leaves those to its
compiler) and the documented limits (parse/limits.py).
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from hlo_passes import HloParseError, parse_module  # noqa: E402
from tests.frontend.fuzz import mutants, seed_texts  # noqa: E402

_WORKER = """
import json, sys
from hlo_passes.runtime.xla_backend import canonical_text, quiet_cpp_logs
quiet_cpp_logs()
items = json.load(open(sys.argv[1]))
for item in items[int(sys.argv[2]):]:
    print(json.dumps({"i": item["i"]}), flush=True)  # a crash leaves this line last
    try:
        canonical_text(item["text"])
        verdict = "accept"
    except Exception:
        verdict = "reject"
    print(json.dumps({"i": item["i"], "xla": verdict}), flush=True)
"""


def xla_verdicts(items: list[dict], path: str) -> dict[int, str]:
    verdicts: dict[int, str] = {}
    start = 0
    env = dict(os.environ, PYTHONPATH=str(ROOT), TF_CPP_MIN_LOG_LEVEL="3")
    while start < len(items):
        done = subprocess.run([sys.executable, "-c", _WORKER, path, str(start)], capture_output=True, text=True,
                              env=env)
        last = None
        for line in done.stdout.splitlines():
            record = json.loads(line)
            last = record["i"]
            if "xla" in record:
                verdicts[last] = record["xla"]
        if last is None:
            break
        verdicts.setdefault(last, "crash")
        start = last + 1
    return verdicts


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--count", type=int, default=2000)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--show", type=int, default=20, help="mutants to list per disagreement")
    args = ap.parse_args()
    items = []
    for i, (description, text) in enumerate(mutants(seed_texts(), args.count, args.seed)):
        try:
            parse_module(text)
            ours = "accept"
        except HloParseError:
            ours = "reject"
        items.append({"i": i, "description": description, "text": text, "ours": ours})
    with tempfile.NamedTemporaryFile("w", suffix=".json", delete=False) as f:
        json.dump(items, f)
    try:
        verdicts = xla_verdicts(items, f.name)
    finally:
        os.unlink(f.name)
    counts = collections.Counter((item["ours"], verdicts.get(item["i"], "?")) for item in items)
    print(f"{args.count} mutants (seed {args.seed}):")
    for (ours, xla), n in sorted(counts.items()):
        print(f"  we {ours:6s}  XLA {xla:6s}  {n:6d}  ({100 * n / len(items):.1f}%)")
    for title, want in (("we accept, XLA rejects or crashes", lambda o, x: o == "accept" and x != "accept"),
                        ("we reject, XLA accepts", lambda o, x: o == "reject" and x == "accept")):
        listed = [item for item in items if want(item["ours"], verdicts.get(item["i"]))]
        print(f"{title}: {len(listed)}")
        for item in listed[:args.show]:
            print("   ", item["description"])
    return 0


if __name__ == "__main__":
    sys.exit(main())
