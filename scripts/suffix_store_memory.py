"""The suffix store stays under its token cap through many requests: N generations with the default
drafter (auto) on the tiny model, distinct prompts from several clients; prints the store's size and the
process's resident memory as it goes.

    .venv/bin/python scripts/suffix_store_memory.py --requests 1000 --cap 20000
"""
from __future__ import annotations

import argparse
import random
import resource

from specdecode.build import EngineOptions, build_engine

WORDS = ("alpha beta gamma delta merge sort list value index count table river stone cloud light "
         "number string return print window shadow garden market bridge").split()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=1000)
    parser.add_argument("--cap", type=int, default=20_000, help="suffix store size in tokens")
    parser.add_argument("--max-new-tokens", type=int, default=24)
    args = parser.parse_args()
    engine, drafter = build_engine(EngineOptions(model="smollm2-135m", ctx=1024, suffix_store_tokens=args.cap))
    rng = random.Random(0)
    peak = 0
    for i in range(args.requests):
        prompt = "Repeat and continue: " + " ".join(rng.choice(WORDS) for _ in range(rng.randint(20, 120)))
        engine.generate(prompt, drafter=drafter, max_new_tokens=args.max_new_tokens, chat=False,
                        namespace=f"client-{i % 7}")
        peak = max(peak, engine.suffix_store.tokens)
        assert engine.suffix_store.tokens <= args.cap
        if (i + 1) % 100 == 0:
            rss_mb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
            print(f"{i + 1} requests: store {engine.suffix_store.tokens} tokens in {len(engine.suffix_store)} sequences"
                  f" (peak {peak}, cap {args.cap}), {len(engine.suffix_store._index)} index keys, max RSS {rss_mb:.0f} MB",
                  flush=True)


if __name__ == "__main__":
    main()
