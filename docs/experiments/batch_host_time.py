"""The host's time per request and pass in BatchEngine, the device's work left out (issue 50: on a GPU this time is
spent while the device waits, and it bounds the batched throughput).

16 greedy requests on smollm2 (its real tokenizer, detokenizing included), plain decoding, 128 tokens each. The
target's pass is replaced by a stub that advances the caches and hands out rows of fixed random logits over the
first 1,024 token ids: small, so that the argmax (a GPU's work, a CPU's costly one) stays out of the figure, as the
pass itself does. Everything else a pass does on the host is in it: admission, plans, segments, the argmax read,
verdicts, stop checks, detokenizing, events. Prints the median of the runs after one that warms the slots (on the
2-core machines, figures vary by a third from one process to the next: compare runs of one process, or many).

--device-ms D makes the stub a device pass of D ms that runs while the host goes on (as a GPU's launch returns at
once): pass_timings.wait_for_device then waits until D ms after the launch. A pass then costs D plus the host work
that cannot overlap the device; --overlap on/off says whether the batch publishes events during the next pass.

--verdicts host|device|both: the greedy verdicts judged per request on the host from the argmaxes (the CPU's
default), or together by accept.py (the GPU path's default; here its torch reference on the CPU); both alternates
the two in one process, run by run, and prints each (the comparison to trust on these machines).

--ahead on|off|both: BatchEngine's launch_ahead (batch_ahead.py): each pass after the first launched from the
device's argmaxes before the pass before it is read (the stub's device runs its passes one after another), and that
pass read with one copy that waits for it alone; with --device-ms the host's work of a pass then overlaps the next.

    .venv/bin/python docs/experiments/batch_host_time.py                          # host time per pass and request
    .venv/bin/python docs/experiments/batch_host_time.py --device-ms 2 --overlap on   # a pass's wall time beyond D
    .venv/bin/python docs/experiments/batch_host_time.py --profile tottime        # and a profile of the last run
    .venv/bin/python docs/experiments/batch_host_time.py --verdicts both          # host vs device verdicts
    .venv/bin/python docs/experiments/batch_host_time.py --device-ms 2 --overlap on --ahead both  # launch_ahead
"""
import argparse
import cProfile
import gc
import pstats
import statistics
import time

import torch

from specdecode import batch as batch_module, pass_timings
from specdecode.batch import BatchEngine
from specdecode.build import EngineOptions, build_engine

REQUESTS, TOKENS, WIDTH = 16, 128, 1024

parser = argparse.ArgumentParser()
parser.add_argument("--runs", type=int, default=8)
parser.add_argument("--device-ms", type=float, default=0.0)
parser.add_argument("--overlap", choices=["on", "off"], default="off")
parser.add_argument("--freeze", action="store_true", help="gc.freeze() once the models are loaded")
parser.add_argument("--profile", nargs="?", const="cumulative", help="profile the last run, sorted by this")
parser.add_argument("--verdicts", choices=["host", "device", "both"], default="host")
parser.add_argument("--ahead", choices=["on", "off", "both"], default="off")
args = parser.parse_args()

engine, _ = build_engine(EngineOptions(model="smollm2-135m"))
gen = torch.Generator().manual_seed(0)
rows = torch.randn(4096, WIDTH, generator=gen)
rows[:, [i for i in engine.target.tokenizer.eos_ids if i < WIDTH]] = float("-inf")  # every answer runs its length
cursor, device_done = [0], [0.0]


def next_rows(count):
    first = cursor[0] % (len(rows) - 64)
    cursor[0] += count
    return rows[first : first + count]


def launched():  # the stub's device runs its passes one after another, each device_ms long
    device_done[0] = max(time.perf_counter(), device_done[0]) + args.device_ms / 1e3


def stub_pass(segments):
    out = []
    for seg in segments:
        seg.cache.length += seg.rows
        count = {"all": seg.rows, "last": 1}.get(seg.logits, 0)
        out.append(next_rows(count) if count else None)
    launched()
    return out


def stub_steps(caches, tokens):  # Transformer.steps_from_device: one row per cache, its token on the device
    for cache in caches:
        cache.length += 1
    launched()
    return next_rows(len(caches))


class LaterRead:  # batch_ahead.LaterRead: waits for the passes launched before it only
    def __init__(self, values):
        self.values, self.ready = values, device_done[0]

    def tolist(self):
        while time.perf_counter() < self.ready:
            pass
        return self.values.tolist()


def wait_for_device(device):
    while time.perf_counter() < device_done[0]:
        pass


if args.freeze:
    gc.freeze()
engine.target.model.forward_batch = stub_pass
engine.target.model.steps_from_device = stub_steps
pass_timings.wait_for_device = wait_for_device
batch_module.LaterRead = LaterRead
prompts = [torch.randint(100, 20000, (32,), generator=gen).tolist() for _ in range(REQUESTS)]
verdicts = ["host", "device"] if args.verdicts == "both" else [args.verdicts]
aheads = ["off", "on"] if args.ahead == "both" else [args.ahead]
modes = [f"{v} verdicts, ahead {a}" for v in verdicts for a in aheads]
batches = {f"{v} verdicts, ahead {a}": BatchEngine(engine, max_batch=REQUESTS, prefill_rows=256,
                                                   overlap=args.overlap == "on", device_verdicts=v == "device",
                                                   launch_ahead=a == "on") for v in verdicts for a in aheads}
published = [0.0]


def timed(publish):  # the events handed out while the device runs the next pass (overlap on)
    def timed_publish():
        t0 = time.perf_counter()
        publish()
        published[0] += time.perf_counter() - t0
    return timed_publish


for batch in batches.values():
    batch._publish = timed(batch._publish)
profile, runs, hidden = cProfile.Profile(), {mode: [] for mode in modes}, {}
for run in range(args.runs):
    for mode, batch in batches.items():
        if run == args.runs - 1 and args.profile and mode == modes[-1]:
            profile.enable()
        passes, started, published[0] = batch.passes, time.perf_counter(), 0.0
        batch.generate_many(prompts, drafter="none", max_new_tokens=TOKENS)
        runs[mode].append((time.perf_counter() - started) / (batch.passes - passes) - args.device_ms / 1e3)
        hidden[mode] = published[0] / (batch.passes - passes)
        profile.disable()
for mode in modes:
    timings = runs[mode][1:] or runs[mode]
    seconds = statistics.median(timings)
    print(f"{REQUESTS} requests, {mode}, overlap {args.overlap}, device pass {args.device_ms} ms: "
          f"{seconds * 1e3:.2f} ms of host time per pass beyond the device's, {seconds / REQUESTS * 1e6:.1f} us per "
          f"request (median of {len(timings)} runs: {' '.join(f'{r / REQUESTS * 1e6:.0f}' for r in timings)}); "
          f"events published during a pass: {hidden[mode] / REQUESTS * 1e6:.1f} us per request (last run)")
if args.profile:
    pstats.Stats(profile).sort_stats(args.profile).print_stats(30)
