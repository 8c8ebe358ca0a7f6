"""The mutation oracle's longer run (tests/mutation.py; the suite runs the same oracle bounded, in
tests/test_mutation_oracle.py).

    .venv/bin/python bench/mutation_long.py                      # 20,000 seeded mutants, seeds from 1
    .venv/bin/python bench/mutation_long.py -n 100000 --seed 7   # more, from another seed
    .venv/bin/python bench/mutation_long.py --save               # each new class of violation -> the corpus

Prints the mutants per second, the reference's verdicts against the audit's exit codes, and every violation grouped
by class (property, fixture, field with names taken out) with one example each. --save writes the first mutant of
each class no corpus file covers yet to tests/data/mutation_corpus/<class>.json (fill in its `bug` line), so the
suite replays it every run. The same run is in the suite with KIMI_AUDIT_MUTATIONS=N (and KIMI_AUDIT_MUTATION_SEED).
"""

from __future__ import annotations

import argparse
import json
import re
import sys
import tempfile
import time
from collections import Counter, defaultdict
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))

import mutation as mu


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("-n", type=int, default=20_000, help="seeded random mutants (default 20,000)")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--save", action="store_true", help="write one corpus file per new class of violation")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="kimi-mutation-") as d:
        scratch = Path(d)
        mu.set_work_root(scratch)
        start = time.perf_counter()
        mutations = mu.structural_mutations() + list(mu.random_mutations(args.seed, args.n))
        table: Counter[tuple[str, str, int | None]] = Counter()
        groups: dict[str, list[mu.Outcome]] = defaultdict(list)
        slowest = 0.0
        for i, m in enumerate(mutations, 1):
            o = mu.check(m, scratch)
            table[(m["fixture"], o.reference.verdict, o.exit_code)] += 1
            slowest = max(slowest, o.seconds)
            if o.violations:
                groups[mu.signature(o)].append(o)
            if i % 2000 == 0:
                print(f"  {i} mutants, {time.perf_counter() - start:.0f} s", file=sys.stderr)
        took = time.perf_counter() - start
    print(f"{len(mutations)} mutants in {took:.1f} s ({len(mutations) / took:.0f}/s); slowest audit {slowest:.2f} s")
    print("fixture, reference verdict, exit code: count")
    for (fixture, verdict, code), n in sorted(table.items(), key=str):
        print(f"  {fixture:28} {verdict:8} {code}: {n}")
    print(f"{sum(len(g) for g in groups.values())} violations in {len(groups)} classes")
    covered = {json.dumps(doc["mutation"], sort_keys=True) for _, doc in mu.corpus()}
    for sig, group in sorted(groups.items()):
        print(f"  {len(group)} x {sig}\n      e.g. {group[0].summary()[:500]}")
        if args.save and not any(json.dumps(o.mutation, sort_keys=True) in covered for o in group):
            name = re.sub(r"[^A-Za-z0-9]+", "-", sig).strip("-").lower()[:80]
            path = mu.CORPUS / f"{name}.json"
            path.write_text(json.dumps(mu.corpus_entry(group[0], "TODO: the bug in words"), indent=1) + "\n")
            print(f"      saved {path}")
    return 1 if groups else 0


if __name__ == "__main__":
    raise SystemExit(main())
