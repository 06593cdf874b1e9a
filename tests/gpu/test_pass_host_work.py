"""A batched pass on the GPU path costs the host the same device work however many requests share it: what follows
the pass (finishing the logits, the greedy requests' argmaxes) runs once over all its rows, not once per request.
On a GPU every such operation is a launch the host pays microseconds for while the device waits (issue 50: 16
batched requests >= 10x one, bounded by the host). Counted here as the torch operations a pass dispatches, views
aside (they launch nothing), through the Triton kernels in the interpreter."""
from __future__ import annotations

from collections import Counter
from types import SimpleNamespace

import pytest
from torch.utils._python_dispatch import TorchDispatchMode, _disable_current_modes

from specdecode.batch import BatchEngine
from specdecode.engine import Engine
from specdecode.gpu.exact_pass import ExactPass
from gpu_models import CONTEXT, tiny_gpu_model
from testlib import as_loaded, fake_tokenizer


class CountOps(TorchDispatchMode):
    def __init__(self):
        super().__init__()
        self.ops: Counter = Counter()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if not func.is_view:
            self.ops[str(func)] += 1
        return func(*args, **(kwargs or {}))


def unobserved_kernels(monkeypatch):
    """The pass's kernels run out of the count: on CUDA they are one graph replay (the interpreter's own tensor work
    would only slow the count down)."""
    forward = ExactPass.forward

    def quiet(self, *args):
        with _disable_current_modes():
            return forward(self, *args)

    monkeypatch.setattr(ExactPass, "forward", quiet)


def ops_of_a_decoding_pass(engine: Engine, requests: int, drafter: str) -> Counter:
    batch = BatchEngine(engine, max_batch=requests, prefill_rows=CONTEXT)
    for i in range(requests):
        batch.submit([5 + i, 9, 3, 5 + i, 9], drafter=drafter, k=3, max_new_tokens=12)  # (a fixed K: no timing)
    batch.step()  # the prompts
    assert len(batch.running) == requests and not any(t.pending for t in batch.running)
    with CountOps() as counted:
        batch.step()
    return counted.ops


@pytest.mark.parametrize("model,drafter", [("qwen2-gqa-bias", "none"), ("gemma3-windowed", "lookup")])  # gemma3:
def test_a_passs_device_work_does_not_grow_with_its_requests(model, drafter, monkeypatch):  # soft-capped logits
    unobserved_kernels(monkeypatch)
    target = tiny_gpu_model(model)
    engine = Engine(as_loaded(target, fake_tokenizer(target.config.vocab_size)), max_context=CONTEXT)
    two, five = ops_of_a_decoding_pass(engine, 2, drafter), ops_of_a_decoding_pass(engine, 5, drafter)
    assert five == two
    assert two["aten.argmax.default"] == 1


def test_a_batched_pass_is_timed_until_the_device_has_run_it(monkeypatch):
    """A GPU returns from a pass once it is launched. The pass's time (the tuner's cost of its rows, each request's
    share of it) and a shared draft pass's time must include the device's work, or verifying rows looks nearly
    free beside draft passes (whose proposals read their logits, waiting for the device). On a clock that only the
    device's run moves (1 s a pass, in pass_timings.wait_for_device), each pass must take its 1 s."""
    from specdecode import batch as batch_module, batch_draft, pass_timings
    from gpu_models import tiny_target_and_draft

    clock = [0.0]
    fake_time = SimpleNamespace(perf_counter=lambda: clock[0])
    monkeypatch.setattr(batch_module, "time", fake_time)
    monkeypatch.setattr(batch_draft, "time", fake_time)
    monkeypatch.setattr(pass_timings, "wait_for_device", lambda device: clock.__setitem__(0, clock[0] + 1.0))
    target, draft = tiny_target_and_draft()
    tokenizer = fake_tokenizer(target.config.vocab_size)
    engine = Engine(as_loaded(target, tokenizer, "target"), as_loaded(draft, tokenizer, "draft"), max_context=CONTEXT)
    recorded = []
    monkeypatch.setattr(engine.tuner.costs, "record_target", lambda rows, seconds: recorded.append(seconds))
    batch = BatchEngine(engine, max_batch=2, prefill_rows=CONTEXT)
    tickets = [batch.submit([5 + i, 9, 3, 5 + i, 9], drafter="draft", k=2, max_new_tokens=6) for i in range(2)]
    batch.step()  # the prompts (a pass whose cost is not recorded: it reads prompt rows)
    passes = batch.draft_passes
    batch.step()
    assert recorded == [1.0]  # the target's pass
    shares = [t.generation.draft_seconds for t in tickets]  # each request's half of every shared draft pass
    assert batch.draft_passes > passes and shares == [0.5 * (batch.draft_passes - passes)] * 2
