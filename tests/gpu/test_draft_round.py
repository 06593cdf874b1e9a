"""A greedy draft chain past its first token runs as one device round (gpu/draft_round.py): each pass fed the argmax
of the pass before on the device, read once at the end. It must draft exactly what the pass-by-pass loop drafts
(tokens, where the stop rule cuts, what the draft cache then holds), alone and for many sequences in lockstep,
and the engine's output stays plain decoding's. A broken twin whose argmax feeds the wrong step must be caught."""
from __future__ import annotations

import functools

import pytest
import torch

from specdecode.batch import BatchEngine
from specdecode.drafters.base import StopRule
from specdecode.drafters.draft_model import DraftModelDrafter
from specdecode.engine import Engine
from specdecode.gpu import draft_round
from specdecode.sampling import PositionNoise, SamplingParams
from gpu_models import CONTEXT, tiny_target_and_draft
from testlib import as_loaded, fake_tokenizer

GREEDY = SamplingParams()
SAMPLED = SamplingParams(temperature=0.9, top_p=0.95, seed=11)
CONTEXTS = [[17, 3, 99, 250, 3, 17, 42, 8], [5, 9, 3], [200, 201, 7, 7, 7, 7, 1, 2, 3, 4, 5]]


@functools.lru_cache(maxsize=None)
def models():
    return tiny_target_and_draft()


class CutsAtLowConfidence(StopRule):
    """A stop rule that drops a token below 0.075 probability and ends the chain after one below 0.085 (the tiny
    draft's top probabilities are 0.07-0.5): both of the loop's decisions then fall inside some rounds."""

    def keep(self, drafted, chain_prob, confidence):
        return confidence >= 0.075

    def extend(self, drafted, chain_prob, confidence):
        return confidence >= 0.085


def draft_with(device_rounds: bool, rule=None, k: int = 6, sampling: SamplingParams = GREEDY):
    """Each context's drafts (tokens, confidences, passes, the cache's tokens after) from one drafter that proposes
    for every context in turn (so later proposals reuse and roll back what the earlier ones left in the cache)."""
    drafter = DraftModelDrafter(models()[1], CONTEXT)
    drafter.device_rounds = device_rounds
    out = []
    for context in CONTEXTS + CONTEXTS[:1]:
        draft = drafter.propose(context, k, sampling, PositionNoise(7), rule)
        out.append((draft.tokens, draft.confidences, draft.forward_passes, list(drafter.cached),
                    drafter.cache.length))
    return out


def rounds_match_pass_by_pass(rule=None, sampling: SamplingParams = GREEDY) -> int:
    """Checks the rounds' drafts against the loop's; returns how many chains the stop rule cut inside a round."""
    rounds, loop = draft_with(True, rule, sampling=sampling), draft_with(False, rule, sampling=sampling)
    cut = 0
    for (tokens, probs, passes, cached, length), (tokens2, probs2, passes2, cached2, _) in zip(rounds, loop):
        assert tokens == tokens2
        assert str(probs) == str(probs2)  # the same bits (NaN where no rule reads them)
        assert length == len(cached)
        # the round drafts all of k: a chain cut by the stop rule leaves more fed tokens in the cache than the loop
        assert cached[: len(cached2)] == cached2 and passes >= passes2
        cut += 1 < len(tokens) < passes
    return cut


@pytest.mark.parametrize("sampling", [GREEDY, SAMPLED], ids=["greedy", "sampled"])
def test_a_round_drafts_what_the_pass_by_pass_loop_drafts(sampling):
    """Sampled: the round's draws race on the device (gpu/noise_kernel.py), the loop's on the host."""
    rounds_match_pass_by_pass(sampling=sampling)


def test_the_stop_rule_cuts_a_round_where_it_cuts_the_loop():
    assert rounds_match_pass_by_pass(CutsAtLowConfidence()) >= 2


def test_a_proposal_is_two_host_reads(monkeypatch):
    """A proposal of 6 tokens reads the device twice: its first token with its probability, then the round (the
    passes of a round read nothing back). Pass by pass it read twice a token."""
    reads = []
    tolist = torch.Tensor.tolist
    monkeypatch.setattr(torch.Tensor, "tolist", lambda self: reads.append(self.shape) or tolist(self))
    drafter = DraftModelDrafter(models()[1], CONTEXT)
    drafter.propose(CONTEXTS[0], 6, GREEDY, PositionNoise(0), CutsAtLowConfidence())
    assert len(reads) == 2


def feeds_the_token_before(model, plans, ordered):
    """Broken twin: each pass is fed the token chosen two passes back (the round's argmax lands one step late)."""
    device = model.device
    metas = [torch.from_numpy(plan.meta).to(device) for plan in plans]
    earlier = current = torch.tensor([r.token for r in ordered], device=device)
    chosen, probs = [], []
    for plan, meta in zip(plans, metas):
        logits = model._finish_logits(model.exact_pass.launch(plan, meta, tokens=earlier[: plan.rows]))
        earlier, current = current, logits.argmax(dim=-1)
        chosen.append(current)
        probs.append(torch.softmax(logits.float(), -1).amax(dim=-1))
    return chosen, probs, []


def test_the_check_catches_a_round_whose_argmax_feeds_the_wrong_step(monkeypatch):
    monkeypatch.setattr(draft_round, "_launch_steps", feeds_the_token_before)
    with pytest.raises(AssertionError):
        rounds_match_pass_by_pass()


@functools.lru_cache(maxsize=None)
def engine() -> Engine:
    target, draft = models()
    tokenizer = fake_tokenizer(target.config.vocab_size)
    return Engine(as_loaded(target, tokenizer, "target"), as_loaded(draft, tokenizer, "draft"), max_context=CONTEXT,
                  check_invariants=True)


def test_batched_rounds_draft_and_decode_as_each_request_alone(monkeypatch):
    """Requests of a batch, greedy and seeded, draft their rounds in lockstep (one pass per step for all of them),
    their first tokens read at once: each gets plain decoding's output (seeded: the seeded plain text), as the
    sampled one does alone, and the rounds and the reads did serve several requests at once."""
    from specdecode import batch_draft

    ran, read = [], []
    chain_rounds, read_ahead = draft_round.chain_rounds, batch_draft._read_ahead
    monkeypatch.setattr(draft_round, "chain_rounds", lambda model, rounds: ran.append(len(rounds))
                        or chain_rounds(model, rounds))

    def counted(model, members, outputs):
        wrapped = read_ahead(model, members, outputs)
        read.append(sum(isinstance(out, batch_draft.ReadAhead) for out in wrapped))
        return wrapped

    monkeypatch.setattr(batch_draft, "_read_ahead", counted)
    eng = engine()
    prompts, settings = [c + [3] for c in CONTEXTS], [GREEDY, SAMPLED, GREEDY]
    plain = [eng.generate(p, drafter="none", max_new_tokens=8, sampling=s).token_ids for p, s in zip(prompts, settings)]
    assert eng.generate(prompts[1], drafter="draft", k=4, max_new_tokens=8, sampling=SAMPLED).token_ids == plain[1]
    batch = BatchEngine(eng, max_batch=len(prompts))
    tickets = [batch.submit(p, drafter="draft", k=4, max_new_tokens=8, sampling=s) for p, s in zip(prompts, settings)]
    batch.run()
    assert [t.result().token_ids for t in tickets] == plain
    assert any(count > 1 for count in ran), "no round ran for several requests at once"
    assert any(count > 1 for count in read), "no first tokens were read together"


def read_aheads(read_ahead, outputs):
    """The tops `read_ahead` gives three draft-model members of a pass."""
    from types import SimpleNamespace

    drafter = DraftModelDrafter(models()[1], CONTEXT)
    members = [SimpleNamespace(generation=SimpleNamespace(drafter=drafter)) for _ in outputs]
    return [out.top for out in read_ahead(models()[1], members, outputs)]


def test_a_batch_reads_its_draft_models_next_choices_at_once():
    """A batched draft pass's next-token choices (top probability, argmax) for every sequence in one read, each
    the bits top_choice reads for its row alone; a twin that hands them to the wrong sequences is caught."""
    from specdecode import batch_draft
    from specdecode.drafters.draft_model import top_choice

    outputs = [torch.randn(1, models()[1].config.vocab_size) * scale for scale in (1.0, 3.0, 0.3)]
    alone = [top_choice(out[-1], True, True) for out in outputs]
    assert read_aheads(batch_draft._read_ahead, outputs) == alone

    def handed_round(model, members, outputs):
        wrapped = batch_draft._read_ahead(model, members, outputs)
        tops = [out.top for out in wrapped]
        return [batch_draft.ReadAhead(out.logits, top) for out, top in zip(wrapped, tops[1:] + tops[:1])]

    assert read_aheads(handed_round, outputs) != alone


# ------------------------------------------------------------------ a greedy round as one CUDA graph (issue 64)
def with_round_graphs(on: bool) -> None:
    draft = models()[1]
    draft.exact_pass.round_graphs = on
    draft.exact_pass.rounds = {}


def test_a_round_as_one_graph_drafts_what_the_pass_by_pass_loop_drafts():
    """ExactPass.round_graphs: the round's passes, each fed the argmax before it, as one CUDA graph (here, without
    CUDA, its launches uncaptured over the same static buffers): the loop's tokens, confidence bits and cache, with
    the stop rule cutting inside rounds; one RoundGraph a shape, kept."""
    with_round_graphs(True)
    try:
        assert rounds_match_pass_by_pass(CutsAtLowConfidence()) >= 2
        assert models()[1].exact_pass.rounds  # the graph path ran
    finally:
        with_round_graphs(False)


def test_the_round_graph_check_catches_a_graph_whose_argmax_feeds_the_wrong_step(monkeypatch):
    def late(self):
        """Broken twin: each step's pass is fed the token chosen two steps back."""
        at, earlier = 0, self.first
        current, chosen, probs = self.first, [], []
        for rows, keys, shape in self.steps:
            size = int(torch.tensor(shape).prod())
            meta = self.meta[at : at + size].view(shape)
            at += size
            meta[0, :rows].copy_(earlier[:rows])
            logits = self.model._finish_logits(self.exact.forward(meta, self.pool, keys)[:rows])
            earlier, current = current, logits.argmax(dim=-1)
            chosen.append(current)
            probs.append(torch.softmax(logits.float(), -1).amax(dim=-1))
        return chosen, probs

    monkeypatch.setattr(draft_round.RoundGraph, "_passes", late)
    with_round_graphs(True)
    try:
        with pytest.raises(AssertionError):
            rounds_match_pass_by_pass()
    finally:
        with_round_graphs(False)


def test_greedy_requests_of_a_batch_draft_their_rounds_as_one_graph_and_decode_as_alone():
    """Lockstep rounds of three greedy requests (rows shrinking as chains end) through the round graph: each request
    gets plain decoding's output."""
    eng = engine()
    prompts = [c + [3] for c in CONTEXTS]
    plain = [eng.generate(p, drafter="none", max_new_tokens=8).token_ids for p in prompts]
    with_round_graphs(True)
    try:
        batch = BatchEngine(eng, max_batch=len(prompts))
        tickets = [batch.submit(p, drafter="draft", k=4, max_new_tokens=8) for p in prompts]
        batch.run()
        assert [t.result().token_ids for t in tickets] == plain
        assert any(len(key[0]) > 1 and key[0][0][0] > 1 for key in models()[1].exact_pass.rounds)
    finally:
        with_round_graphs(False)



# ------------------------------------------------------------------ a token tree's depths as one device round
def trees_with(device_rounds: bool, k: int = 5, branch: float = 0.08):
    """Each context's token tree (tokens, parents, passes, the cache's tokens after) from one drafter."""
    drafter = DraftModelDrafter(models()[1], CONTEXT)
    drafter.device_rounds = device_rounds
    out = []
    for context in CONTEXTS + CONTEXTS[:1]:
        draft = drafter.propose_tree(context, k, branch_min_prob=branch)
        out.append((draft.tokens, draft.parents, draft.forward_passes, list(drafter.cached), drafter.cache.length))
    return out


def test_a_trees_depths_as_one_round_are_the_loops_tree(monkeypatch):
    """The tree drafter's chain past its first depth runs as one device round (each depth's top token feeding the
    next, its runner-up and probability read with it once at the end): the loop's tree, leaves where the loop
    branched, and its cache."""
    ran = []
    chain_rounds = draft_round.chain_rounds
    monkeypatch.setattr(draft_round, "chain_rounds", lambda model, rounds: ran.append([r.tree for r in rounds])
                        or chain_rounds(model, rounds))
    rounds, loop = trees_with(True), trees_with(False)
    assert rounds == loop
    assert ran and all(all(trees) for trees in ran)
    assert any(len(tokens) > 5 for tokens, *_ in loop)  # some depth branched


def test_the_tree_check_catches_leaves_from_the_wrong_depth(monkeypatch):
    take = DraftModelDrafter._take_tree_round

    def shifted(self, best, answer, *rest):
        chosen, runner_ups, seconds = answer
        return take(self, best, (chosen, runner_ups, seconds[1:] + seconds[:1]), *rest)

    monkeypatch.setattr(DraftModelDrafter, "_take_tree_round", shifted)
    assert trees_with(True) != trees_with(False)


def test_tree_and_chain_requests_of_a_batch_share_their_rounds_and_decode_as_alone(monkeypatch):
    """A batch's tree and chain requests draft their rounds in lockstep (a tree's rows choose and read as its loop,
    a chain's as its own): each request gets plain decoding's output."""
    ran = []
    chain_rounds = draft_round.chain_rounds
    monkeypatch.setattr(draft_round, "chain_rounds", lambda model, rounds: ran.append({r.tree for r in rounds})
                        or chain_rounds(model, rounds))
    eng = engine()
    prompts = [c + [3] for c in CONTEXTS]
    plain = [eng.generate(p, drafter="none", max_new_tokens=8).token_ids for p in prompts]
    batch = BatchEngine(eng, max_batch=len(prompts))
    tickets = [batch.submit(p, drafter=d, k=4, max_new_tokens=8) for p, d in zip(prompts, ["tree", "draft", "tree"])]
    batch.run()
    assert [t.result().token_ids for t in tickets] == plain
    assert {True, False} in ran, "no round held a tree and a chain at once"
