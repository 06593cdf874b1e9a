"""The speculative decoding loop: draft, verify in one target pass, accept, roll back, repeat."""
from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Callable, Iterator

import torch

from . import kernels
from .drafters.base import Draft, Drafter
from .drafters.draft_model import DraftModelDrafter, TreeDrafter, common_prefix_len
from .drafters.registry import drafter_spec
from .drafters.vocab import frequent_token_ids
from .errors import InputError, ModelError
from .models.loader import LoadedModel
from .models.transformer import Transformer, tree_mask, tree_positions
from .policy import ConfidenceCalibration, CostModel, DraftLengthPolicy, DraftStopRule
from .sampling import SamplingParams
from .stats import GenerationStats
from .tokenizer import StreamDecoder
from .verify import verify_greedy, verify_sampling, verify_tree_greedy

# Tokens an answer is assumed to still have before it has shown more: the draft model reads a prompt
# at once only if drafting that many tokens would repay the read (see Engine._draft_prefill_pays).
ANSWER_CREDIT = 32


@dataclass
class StreamEvent:
    text: str  # new text since the previous event
    tokens: list[int]  # new tokens of this step (a stop string completed a step later can end the answer
    # before the last of them: the final stats.generated_tokens is the answer's length)
    origins: list[str]  # per token: "draft" (accepted draft), "target" (correction / plain), "bonus"
    stats: GenerationStats
    finished: bool = False


@dataclass
class GenerationResult:
    text: str
    token_ids: list[int]
    origins: list[str]
    stats: GenerationStats
    prompt_ids: list[int] = field(default_factory=list)

    @property
    def finish_reason(self) -> str:
        return self.stats.finish_reason


class Engine:
    """Holds the target (and optional draft) model with their caches; generates one sequence at a time."""

    def __init__(
        self,
        target: LoadedModel,
        draft: LoadedModel | None = None,
        max_context: int | None = None,
        prefill_chunk: int = 1024,
        check_invariants: bool = False,
        draft_vocab: int | None = 32768,
    ):
        self.target = target
        self.draft = draft
        if draft is not None:
            check_same_tokenizer(target, draft)
            # A draft that is the target object itself must keep the full vocabulary.
            if draft_vocab and isinstance(draft.model, Transformer) and draft.model is not target.model:
                subset = frequent_token_ids(draft.tokenizer, draft_vocab)
                if subset is not None and len(subset) < draft.vocab_size:
                    draft.model.set_vocab_subset(subset)
        self.tokenizer = target.tokenizer
        self.cache = target.model.new_cache(max_context)
        self.max_context = self.cache.max_len
        self.cached_ids: list[int] = []  # tokens whose keys/values the target cache holds
        # A float32 target computes blocks of up to FLOAT32_CHUNKED_MAX_ROWS rows row-exactly (larger ones
        # through the GEMM): prompts fed in such chunks leave in the cache the keys and values decode steps
        # would have written, so a request that reuses a cached prefix (a chat continuation) gets the tokens
        # a fresh run gets. int8 targets are row-exact at any size; other targets keep the larger chunks.
        if isinstance(target.model, Transformer) and target.model.device.type == "cpu" and not target.model.int8:
            prefill_chunk = min(prefill_chunk, kernels.FLOAT32_CHUNKED_MAX_ROWS)
        self.prefill_chunk = prefill_chunk
        self.costs = CostModel()
        # Learned across generations, per drafter: how often the target accepts a draft token of a given
        # confidence (the draft model's top probability, or prompt lookup's match-length score).
        self.calibrations: dict[str, ConfidenceCalibration] = {}
        # Per drafter, the speedup its drafting steps reached in recent generations (decayed average):
        # the prior a new generation starts from, so a pair that keeps losing starts with plain decoding.
        self.drafting_speedup: dict[str, float] = {}
        self.draft_prefill_cost: dict[str, float] = {}  # seconds per prompt token, measured on lazy prefills
        self.check_invariants = check_invariants
        self._drafters: dict[str, Drafter] = {}
        self.last_prompt_ids: list[int] = []
        self._live_generation: object | None = None

    def reset(self) -> None:
        """Forget cached prefixes (benchmarks call this so no method inherits another's prefill).

        What the engine has learned about the models (costs, draft calibration, drafting speedup) is kept.
        """
        self.cache.truncate(0)
        self.cached_ids = []
        for drafter in self._drafters.values():
            drafter.reset()

    # ----------------------------------------------------------------- set-up helpers
    def drafter(self, name: str | Drafter | None, min_confidence: float = 0.0) -> Drafter | None:
        if name is None or isinstance(name, Drafter):
            return name
        spec = drafter_spec(name)
        if spec.build is None:
            return None
        if spec.needs_draft_model and self.draft is None:
            raise InputError(f"drafter '{spec.name}' needs a draft model (load the engine with one)")
        drafter = self._drafters.get(spec.name)
        if drafter is None:
            drafter = self._drafters[spec.name] = spec.build(self.draft.model if self.draft else None, self.max_context)
        if spec.needs_draft_model:
            drafter.min_confidence = min_confidence
        return drafter

    @staticmethod
    def resolve_max_k(max_k: int | None, drafter: Drafter | None) -> int:
        """The caller's largest K, or the drafter's own default (prompt lookup copies longer runs)."""
        if max_k is not None:
            if not isinstance(max_k, int) or max_k < 1:
                raise InputError(f"max_k must be an integer >= 1, got {max_k!r}")
            return max_k
        return drafter.default_max_k if drafter is not None else Drafter.default_max_k

    def encode_prompt(self, prompt: str | list[dict] | list[int], chat: bool | None = None) -> list[int]:
        if isinstance(prompt, list) and prompt and all(isinstance(t, int) and not isinstance(t, bool) for t in prompt):
            vocab = self.target.vocab_size
            bad = [t for t in prompt if not 0 <= t < vocab]
            if bad:
                raise InputError(f"token ids must be in 0..{vocab - 1}; got {bad[:5]}")
            return list(prompt)
        if isinstance(prompt, list) and not prompt:
            raise InputError("the prompt is empty")
        if isinstance(prompt, list):  # chat messages
            if not self.tokenizer.has_chat_template:
                raise InputError("this model has no chat template; send a plain prompt")
            return self.tokenizer.encode(self.tokenizer.chat_prompt(prompt))
        if not isinstance(prompt, str):
            raise InputError("prompt must be a string, a list of chat messages or a list of token ids")
        use_chat = self.tokenizer.has_chat_template if chat is None else chat
        if use_chat and not self.tokenizer.has_chat_template:
            raise InputError("this model has no chat template; use --no-chat")
        text = self.tokenizer.chat_prompt([{"role": "user", "content": prompt}]) if use_chat else prompt
        return self.tokenizer.encode(text)

    # ----------------------------------------------------------------- public API
    def generate(self, prompt, **kwargs) -> GenerationResult:
        text, tokens, origins = [], [], []
        stats = None
        for event in self.stream(prompt, **kwargs):
            text.append(event.text)
            tokens.extend(event.tokens)
            origins.extend(event.origins)
            stats = event.stats
        # A stop string found a step later can end the answer before a token already streamed.
        del tokens[stats.generated_tokens :], origins[stats.generated_tokens :]
        return GenerationResult("".join(text), tokens, origins, stats, list(self.last_prompt_ids))

    def stream(
        self,
        prompt,
        *,
        drafter: str | Drafter | None = "draft",
        k: int | str = "auto",
        sampling: SamplingParams | None = None,
        max_new_tokens: int = 256,
        stop: tuple[str, ...] | list[str] = (),
        chat: bool | None = None,
        min_confidence: float = 0.0,
        max_k: int | None = None,
        should_stop: Callable[[], bool] | None = None,
    ) -> Iterator[StreamEvent]:
        sampling = sampling or SamplingParams()
        if not isinstance(max_new_tokens, int) or max_new_tokens < 1:
            raise InputError(f"max_new_tokens must be an integer >= 1, got {max_new_tokens!r}")
        if k != "auto" and (not isinstance(k, int) or k < 0 or k > 64):
            raise InputError(f"k must be 'auto' or an integer in 0..64, got {k!r}")
        stops = [s for s in (stop or ()) if s]
        prompt_ids = self.encode_prompt(prompt, chat)
        self.last_prompt_ids = prompt_ids
        if not prompt_ids:
            raise InputError("the prompt is empty")
        if len(prompt_ids) >= self.max_context:
            raise InputError(f"the prompt has {len(prompt_ids)} tokens; the context holds {self.max_context}")
        drafter_obj = self.drafter(drafter, min_confidence)
        max_k = max(1, min(self.resolve_max_k(max_k, drafter_obj), self.max_context - 2))
        if isinstance(drafter_obj, TreeDrafter) and not sampling.greedy:
            raise InputError("token-tree drafting supports greedy decoding only; use the chain drafter for sampling")
        return self._loop(prompt_ids, drafter_obj, k, sampling, max_new_tokens, stops, max_k, should_stop)

    # ----------------------------------------------------------------- the loop
    def _prefill(self, prompt_ids: list[int]) -> None:
        """Make the target cache hold prompt_ids[:-1], reusing whatever prefix it already holds."""
        keep = common_prefix_len(self.cached_ids, prompt_ids[:-1])
        self.cache.truncate(keep)
        del self.cached_ids[keep:]
        pending = prompt_ids[keep:-1]
        device = self.target.model.device
        for start in range(0, len(pending), self.prefill_chunk):
            chunk = pending[start : start + self.prefill_chunk]
            self.target.model(torch.tensor(chunk, device=device), self.cache, logits="none")
            self.cached_ids.extend(chunk)

    def _loop(self, prompt_ids, drafter, k, sampling, max_new_tokens, stops, max_k, should_stop):
        stats = GenerationStats(drafter=drafter.name if drafter else "none", prompt_tokens=len(prompt_ids))
        noise = sampling.noise()
        if drafter is not None:
            drafter.accept(prompt_ids[:-1])  # drop state from another sequence; keeps a shared prefix
        fixed_k = None if k == "auto" else int(k)
        if drafter is not None and fixed_k is None and (
            not self.costs.known(max_k) or (drafter.has_model and drafter.name not in self.costs.draft)
        ):
            t0 = time.perf_counter()
            self.calibrate(max_k, drafter)
            stats.notes.append(f"measured target/draft costs for the adaptive K once ({time.perf_counter() - t0:.1f}s, not in the timings)")
        started = time.perf_counter()
        # A pinned K drafts exactly K; an adaptive one also ends each chain where it stops paying.
        chain_rule = drafter is not None and drafter.supports_stop_rule and fixed_k is None
        if drafter is not None and drafter.supports_stop_rule:
            calibration = self.calibrations.setdefault(drafter.name, ConfidenceCalibration())
            drafter.stop_rule = DraftStopRule(self.costs, drafter.name, calibration, drafter.min_confidence) if chain_rule else None
        policy = DraftLengthPolicy(self.costs, drafter.name if drafter else "none", fixed_k if drafter else 0, max_k,
                                   chain_stops_itself=chain_rule, drafts_are_free=chain_rule and not drafter.has_model)
        if chain_rule and drafter.name in self.drafting_speedup:
            policy.prior_speedup = min(1.5, max(0.7, self.drafting_speedup[drafter.name]))
        self._prefill(prompt_ids)
        drafter_ready = not (drafter is not None and drafter.has_model)
        # Nothing touches the draft cache until its prefill, so what it lacks of the prompt is fixed until then.
        unread = 0 if drafter_ready else drafter.unread_tokens(prompt_ids)
        stats.time_prefill = time.perf_counter() - started
        decoder = StreamDecoder(self.tokenizer)
        held_back = max((len(s) for s in stops), default=1) - 1
        sequence = list(prompt_ids)  # every token the target has confirmed; cache holds all but the last
        emitted_text = ""
        generated: list[int] = []
        origin_log: list[str] = []  # per generated token: draft / target / bonus
        finish = None
        # An engine holds one cache: a second stream started on it takes the cache over, and this one
        # must not resume on the other's keys and values.
        live = self._live_generation = object()
        while finish is None:
            if self._live_generation is not live:
                raise InputError("this generation was interrupted: another generation started on the same engine,"
                                 " which runs one at a time (finish one stream before starting the next)")
            budget = max_new_tokens - len(generated)
            room = self.cache.max_len - self.cache.length - 1  # positions left after the pending token
            if room < 0:  # the context is full: nothing more can be generated
                stats.finish_reason = finish = "length"
                stats.time_total = time.perf_counter() - started
                self._finalise(stats, policy)
                yield StreamEvent("", [], [], stats, finished=True)
                break
            k_step = min(policy.choose(), budget - 1, room) if drafter is not None else 0
            if isinstance(drafter, TreeDrafter):
                k_step = min(k_step, room // 2)  # a tree block holds up to two tokens per depth
            if k_step > 0 and not drafter_ready and fixed_k is None and not self._draft_prefill_pays(
                drafter.name, policy, unread, len(prompt_ids), budget, len(generated), stats.time_prefill
            ):
                k_step = 0
                policy.plain_steps += 1
            if k_step > 0 and not drafter_ready:
                # The draft model reads the prompt only now, on its first proposal: a generation that never
                # drafts never pays for it. Its time counts in the total but not in the per-step costs.
                t0 = time.perf_counter()
                drafter.prefill(prompt_ids)
                seconds = time.perf_counter() - t0
                stats.time_draft += seconds
                if unread >= 16:
                    old = self.draft_prefill_cost.get(drafter.name)
                    per_token = seconds / unread
                    self.draft_prefill_cost[drafter.name] = per_token if old is None else 0.5 * (old + per_token)
                drafter_ready = True
            t0 = time.perf_counter()
            draft = drafter.propose(sequence, k_step, sampling, noise) if k_step > 0 else Draft()
            t1 = time.perf_counter()
            accepted_tokens, next_token = self._verify(sequence, draft, sampling, noise)
            t2 = time.perf_counter()
            block_size = 1 + len(draft.tokens)
            self.cached_ids.append(sequence[-1])
            self.cached_ids.extend(accepted_tokens)
            new_tokens = accepted_tokens + [next_token]
            sequence.extend(new_tokens)
            stats.decoded_tokens += len(new_tokens)
            drafted = draft.chain_length if draft.parents is not None else len(draft.tokens)
            if drafter is not None:
                drafter.accept(sequence)
                wasted = draft.forward_passes > len(draft.tokens) and draft.parents is None
                policy.update(len(accepted_tokens), drafted, wasted=int(wasted), seconds=self._steady_step_time(draft, drafter, t0, t1, t2),
                              tokens=len(new_tokens))
                self._calibrate_confidence(drafter, draft, len(accepted_tokens))
            if self.check_invariants:
                self._assert_invariants(sequence, drafter)
            bonus = drafted > 0 and len(accepted_tokens) >= drafted
            self._account(stats, draft, drafted, len(accepted_tokens), bonus, block_size, t1 - t0, t2 - t1, drafter)
            origins = ["draft"] * len(accepted_tokens) + ["bonus" if bonus else "target"]
            # Stop conditions, in the order the tokens were produced.
            kept = []
            for token in new_tokens:
                if token in self.tokenizer.eos_ids:
                    finish = "stop"
                    break
                kept.append(token)
                if len(generated) + len(kept) >= max_new_tokens:
                    finish = "length"
                    break
            origins = origins[: len(kept)]
            generated.extend(kept)
            origin_log.extend(origins)
            stats.origins.update(origins)
            decoder.push(kept)
            text = decoder.text
            for s in stops:
                pos = text.find(s, max(0, len(emitted_text) - len(s)))
                if pos >= 0:
                    text = text[:pos]
                    finish = "stop"
                    # The answer ends where the stop string starts: tokens that begin after it are not output.
                    cut = self._tokens_starting_before(generated, len(text))
                    kept = kept[: max(0, len(kept) - (len(generated) - cut))]
                    stats.origins.subtract(origin_log[cut:])
                    stats.origins = +stats.origins  # drop kinds whose count fell to 0
                    del generated[cut:], origin_log[cut:]
                    origins = origins[: len(kept)]
            if finish is None and should_stop is not None and should_stop():
                finish = "cancelled"
            if finish is None and held_back and not decoder.text.endswith("\ufffd"):
                safe = text[: max(len(emitted_text), len(text) - held_back)]
            else:
                safe = text
            delta = safe[len(emitted_text):]
            emitted_text = safe
            stats.generated_tokens = len(generated)
            stats.time_total = time.perf_counter() - started
            if finish is not None:
                stats.finish_reason = finish
                self._finalise(stats, policy)
            yield StreamEvent(delta, kept, origins, stats, finished=finish is not None)

    def _tokens_starting_before(self, tokens: list[int], text_end: int) -> int:
        """How many leading tokens start before character text_end of their decoded text."""
        n = len(tokens)
        while n > 0 and len(self.tokenizer.decode(tokens[: n - 1])) >= text_end:
            n -= 1
        return n

    def _verify(self, sequence: list[int], draft: Draft, sampling, noise) -> tuple[list[int], int]:
        """One target pass over [last accepted token] + draft; rolls the target cache back to what was kept."""
        device = self.target.model.device
        start = self.cache.length
        block = [sequence[-1]] + draft.tokens
        tokens = torch.tensor(block, device=device)
        if draft.parents is not None:
            logits = self.target.model(
                tokens, self.cache,
                positions=tree_positions(start, draft.parents, device),
                attn_mask=tree_mask(start, draft.parents, device),
            )
            path, next_token = verify_tree_greedy(logits, draft.tokens, draft.parents)
            self.cache.compact(start, [0] + path)
            return [block[i] for i in path], next_token
        logits = self.target.model(tokens, self.cache, logits="all")
        if sampling.greedy:
            verdict = verify_greedy(logits, draft.tokens)
        else:
            verdict = verify_sampling(logits, draft.tokens, sampling, noise, position=len(sequence))
        self.cache.truncate(start + 1 + verdict.accepted)
        return draft.tokens[: verdict.accepted], verdict.next_token

    def _draft_prefill_pays(self, name: str, policy: DraftLengthPolicy, unread: int, prompt_len: int, budget: int,
                            generated: int, target_prefill: float) -> bool:
        """Before the draft model reads the prompt (the `unread` tokens its cache lacks): can drafting the
        tokens still to come repay that prefill?

        Saving expected: the tokens still to come, at a plain step each, times (1 - 1/speedup) at the speedup
        the policy's prior expects. How many will come is unknown: the budget overstates it for short answers
        (Spec-Bench RAG answers 9-57 tokens after 600-1000-token prompts, where the draft's ~4-5 s read of
        the prompt made speculation 0.74x of plain decoding's speed over 5 prompts). So, as when renting
        before buying, the engine counts on as many tokens as the answer already has, and at least
        ANSWER_CREDIT: a short prompt is read at once, a long one once the answer has shown it will repay it.
        Prefill cost: measured per prompt token earlier, else estimated from this generation's target
        prefill scaled by the draft/target step cost ratio.
        """
        if unread == 0:
            return True
        plain = self.costs.target_cost(1)
        if plain is None:
            return True
        # A losing history still lets a probe explore, judged at a modest 1.2x.
        speedup = max(policy.prior_speedup, 1.2)
        per_token = self.draft_prefill_cost.get(name)
        if per_token is None:
            draft = self.costs.draft.get(name)
            if draft is None:
                return True
            per_token = target_prefill / max(1, prompt_len) * draft / plain
        expected_left = min(budget, max(generated, ANSWER_CREDIT))
        saving = expected_left * plain * (1.0 - 1.0 / speedup)
        return saving > per_token * unread

    def _steady_step_time(self, draft: Draft, drafter: Drafter, t0: float, t1: float, t2: float) -> float:
        """Draft + verify time of a step, without a catch-up (a probe after plain steps feeds the draft model
        the tokens it missed): that is the price of probing, not of drafting, so the policy must not judge by it."""
        draft_time = t1 - t0
        per_pass = self.costs.draft.get(drafter.name)
        if draft.catch_up > 2 and per_pass is not None:
            draft_time = min(draft_time, per_pass * max(1, draft.forward_passes))
        return draft_time + (t2 - t1)

    def _calibrate_confidence(self, drafter: Drafter, draft: Draft, accepted: int) -> None:
        if draft.parents is not None or not draft.confidences:
            return
        calibration = self.calibrations.setdefault(drafter.name, ConfidenceCalibration())
        # Positions after the first rejection were never judged by the target.
        for i, confidence in enumerate(draft.confidences[: accepted + 1]):
            if confidence == confidence:  # NaN when the drafter did not compute it
                calibration.update(confidence, i < accepted)

    def _account(self, stats, draft, drafted, accepted, bonus, block_size, draft_time, verify_time, drafter) -> None:
        stats.drafted += drafted
        stats.accepted += accepted
        stats.target_passes += 1
        stats.draft_passes += draft.forward_passes
        stats.steps_by_k[drafted] += 1
        stats.accepted_by_k[drafted] += accepted
        stats.time_draft += draft_time
        stats.time_verify += verify_time

        self.costs.record_target(block_size, verify_time)
        # A step that first had to consume many context tokens says nothing about a draft pass's cost.
        if drafter is not None and draft.tokens and draft.catch_up <= 2:
            self.costs.record_draft(drafter.name, draft_time / max(1, draft.forward_passes or len(draft.tokens)))

    def _finalise(self, stats: GenerationStats, policy: DraftLengthPolicy) -> None:
        measured = policy.measured_speedup()
        if policy.chain_stops_itself and measured is not None and policy.drafting_steps >= 3:
            old = self.drafting_speedup.get(stats.drafter)
            self.drafting_speedup[stats.drafter] = measured if old is None else 0.6 * old + 0.4 * measured
        stats.single_step_cost = self.costs.target_cost(1)
        stats.draft_step_cost = self.costs.draft.get(stats.drafter) if stats.drafter != "none" else None
        stats.verify_cost_by_block = {n: self.costs.target_cost(n) for n in sorted(self.costs.target)}
        alpha = stats.alpha
        if alpha is not None and stats.drafted >= 8:
            if alpha < 0.3:
                stats.notes.append(
                    f"low acceptance (alpha {alpha:.2f}): speculation likely costs more than it saves here"
                    + ("; the adaptive policy fell back to plain decoding" if policy.plain_steps else "")
                )
            elif alpha < 0.6:
                stats.notes.append(f"moderate acceptance (alpha {alpha:.2f}): expect a modest speedup at best")
        if policy.plain_steps:
            stats.notes.append(f"adaptive K chose plain decoding for {policy.plain_steps} of {stats.target_passes} steps")

    def _assert_invariants(self, sequence: list[int], drafter) -> None:
        if self.cache.length != len(sequence) - 1:
            raise AssertionError(f"target cache holds {self.cache.length} tokens, expected {len(sequence) - 1}")
        if self.cached_ids != sequence[:-1]:
            raise AssertionError("target cache token record diverged from the sequence")
        if isinstance(drafter, DraftModelDrafter):
            if drafter.cache.length != len(drafter.cached) or drafter.cached != sequence[: len(drafter.cached)]:
                raise AssertionError("draft cache holds tokens that are not a prefix of the sequence")

    # ----------------------------------------------------------------- cost measurement
    def calibrate(self, max_k: int | None, drafter: Drafter | None = None, repeats: int = 3) -> None:
        """Time target passes of 1..max_k+1 tokens (and a draft pass) on scratch positions.

        The fastest of a few repeats is kept: a one-off stall (page faults, another process) must not
        convince the policy that drafting is expensive, since it would then stop drafting and never
        measure again.
        """
        device = self.target.model.device
        max_k = self.resolve_max_k(max_k, drafter)
        scratch = self.target.model.new_cache(max_k + 40)
        max_k = max(1, min(max_k, scratch.max_len - 2))  # a model with a tiny context still gets measured
        warm_len = max(1, min(8, scratch.max_len - (max_k + 1)))
        sizes = sorted({1, 2, 3, max(1, max_k // 2) + 1, max_k + 1})
        warm = torch.zeros(warm_len, dtype=torch.long, device=device)
        self.target.model(warm, scratch, logits="none")

        def fastest(run) -> float:
            times = []
            for _ in range(repeats):
                t0 = time.perf_counter()
                run()
                times.append(time.perf_counter() - t0)
            return min(times)

        for size in sizes:
            if warm_len + size > scratch.max_len:
                continue
            tokens = torch.zeros(size, dtype=torch.long, device=device)

            def target_pass():
                scratch.truncate(warm_len)
                self.target.model(tokens, scratch, logits="all").argmax(-1).tolist()

            self.costs.target[size] = fastest(target_pass)
        if isinstance(drafter, DraftModelDrafter):
            d_cache = drafter.model.new_cache(warm_len + 1)
            drafter.model(warm, d_cache, logits="none")

            def draft_pass():
                d_cache.truncate(warm_len)
                drafter.model(warm[:1], d_cache, logits="last").argmax().item()

            draft_pass()
            self.costs.draft[drafter.name] = fastest(draft_pass)


def check_same_tokenizer(target: LoadedModel, draft: LoadedModel) -> None:
    if target.tokenizer.fingerprint() != draft.tokenizer.fingerprint():
        raise ModelError(
            f"draft '{draft.name}' and target '{target.name}' use different tokenizers"
            f" (vocab {draft.tokenizer.vocab_size} vs {target.tokenizer.vocab_size}); speculation needs the same one"
        )
    if draft.vocab_size != target.vocab_size:
        raise ModelError(
            f"draft '{draft.name}' scores {draft.vocab_size} tokens but target '{target.name}' scores {target.vocab_size}"
        )
