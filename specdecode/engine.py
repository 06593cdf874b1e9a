"""The engine: target and draft models with their caches, and the generation loop around speculative_step.

One token's way: `Engine.stream` encodes the prompt and reads it into the target cache; each loop turn
asks the `GenerationTuning` for K, `speculative_step` has the drafter propose K tokens, scores them in
one target pass, keeps the agreed prefix and rolls both caches back to it; the `Stopper` turns the
step's tokens into text and decides whether the answer is over; the caller gets a `StreamEvent`.
"""
from __future__ import annotations

import sys
import time
from dataclasses import dataclass, field
from typing import Callable, Iterator

import torch

from . import kernels, pass_timings
from .batch_ahead import LaterRead, has_room, next_row_pays, next_tokens, plain_rows
from .controls import LogitControls, RowControls
from .drafters.base import Drafter
from .drafters.draft_model import DRAFT_PREFILL_CHUNK
from .drafters.registry import build_drafter
from .drafters.suffix_store import SuffixStore
from .drafters.vocab import restrict_draft_vocabulary
from .errors import InputError, ModelError
from .grammar import CheckedGrammar, check_grammar
from .models.loader import LoadedModel
from .models.transformer import Transformer
from .opening import Opening, opening_ids
from .sampling import SamplingParams, int64_to_device
from .stats import GenerationStats
from .generation import Generation, StreamEvent
from .text import Stopper
from .tuner import Tuner
from .tuning_params import DEFAULT as DEFAULT_TUNING, TuningParams


@dataclass(frozen=True)
class Request:
    """One generation's settings, checked (Engine.request builds it)."""

    prompt_ids: tuple[int, ...]
    drafter: str | Drafter | None  # a registry name; None: plain decoding
    fixed_k: int | None  # None: the adaptive K
    max_k: int
    sampling: SamplingParams
    max_new_tokens: int
    stop: tuple[str, ...] = ()
    min_confidence: float = 0.0
    namespace: str | None = ""
    should_stop: Callable[[], bool] | None = None
    controls: LogitControls | None = None  # penalties, logit bias, grammar, logprobs (controls.py)
    grammar: CheckedGrammar | None = None  # controls.grammar compiled for this engine's tokenizer


@dataclass
class GenerationResult:
    text: str
    token_ids: list[int]
    origins: list[str]
    stats: GenerationStats
    prompt_ids: list[int] = field(default_factory=list)
    sources: list[str] = field(default_factory=list)  # per token: the source of an accepted draft token, else ""
    logprobs: list = field(default_factory=list)  # per token, a controls.TokenLogprob where the request asked

    @property
    def finish_reason(self) -> str:
        return self.stats.finish_reason


# Tokens of the draft model's frequent-vocabulary head (drafters/vocab.py).
DRAFT_VOCAB = 32768
# The largest draft length a caller may ask for, pinned (k) or as the adaptive policy's ceiling (max_k).
MAX_K = 64


class Engine:
    """Holds the target (and optional draft) model with their caches; generates one sequence at a time."""

    def __init__(
        self,
        target: LoadedModel,
        draft: LoadedModel | None = None,
        max_context: int | None = None,
        prefill_chunk: int = 1024,
        check_invariants: bool = False,
        draft_vocab: int | None = DRAFT_VOCAB,
        suffix_store_tokens: int = 262_144,
        auto_draft_model: bool = True,
        allow_inexact: bool = False,
        tuning_params: TuningParams = DEFAULT_TUNING,
        launch_ahead: bool = False,
        opening: bool | list[int] = True,
    ):
        """opening: the tokens whose keys and values each model reads at load, for every request whose prompt starts
        with them (opening.py): True for the chat template's opening, a list for those ids, [] for none.
        launch_ahead: plain decoding (greedy or sampled) on the GPU path launches each step's pass from the token
        the device chose (argmax, seeded draw) before the step before it is read (`_decode_ahead`); the same tokens.
        Off by default until a device run has timed it (scripts/gpu_check.py)."""
        # Where rows of a block are not computed as the row alone, a verify block can round differently from
        # the decode step it stands for, and at a near-tie speculation then picks another token than plain
        # decoding. A CPU that should have the kernel but lacks it is refused unless the caller accepts that;
        # CUDA and the transformers adapter run, but say so in every generation's statistics.
        self.inexact = inexact_reason(target.model)
        if self.inexact is not None and not allow_inexact and getattr(target.model, "device", None) is not None \
                and target.model.device.type == "cpu" and isinstance(target.model, Transformer):
            raise ModelError(f"{self.inexact}, so speculative output could differ from plain decoding; fix that"
                             " (a C++ compiler and an AVX2 CPU build the kernel) or pass --allow-inexact")
        if self.inexact is not None:
            print(f"specdecode: greedy speculative output is not guaranteed to equal plain decoding here: {self.inexact}",
                  file=sys.stderr)
        self.target = target
        self.draft = draft
        # Whether the default drafter (auto) may draft with `draft`: not where the draft model was loaded
        # only for other drafters (a benchmark's `draft` method) and the default would not load it.
        self.auto_draft_model = auto_draft_model
        if draft is not None:
            proposable = check_same_tokenizer(target, draft)
            if proposable is not None:  # the draft never proposes a padding row (one the target may lack)
                draft.model.set_vocab_limit(proposable)
            # A draft that is the target object itself must keep the full vocabulary.
            if isinstance(draft.model, Transformer) and draft.model is not target.model:
                restrict_draft_vocabulary(draft, draft_vocab)
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
        if isinstance(target.model, Transformer) and target.model.exact_pass is not None:
            prefill_chunk = min(prefill_chunk, target.model.exact_pass.max_rows)
        self.prefill_chunk = prefill_chunk
        self.tuner = Tuner(tuning_params)  # what the engine learns across steps and generations
        self.suffix_store = SuffixStore(suffix_store_tokens)  # earlier requests, for the suffix drafter
        self.check_invariants = check_invariants
        self._drafters: dict[str, Drafter] = {}
        self.last_prompt_ids: list[int] = []
        self._live_generation: object | None = None
        self.launch_ahead = launch_ahead
        self.opening, self.draft_opening = self._read_opening(opening)

    def reset(self) -> None:
        """Forget cached prefixes (benchmarks call this so no method inherits another's prefill).

        What the engine has learned about the models (costs, draft calibration, drafting speedup) is kept, and so is
        the template's opening (read at load, the same for every request: opening.py).
        """
        self.cache.truncate(0)
        self.cached_ids = []
        for drafter in self._drafters.values():
            drafter.reset()

    # ----------------------------------------------------------------- set-up helpers
    def _read_opening(self, opening: bool | list[int]) -> tuple[Opening | None, Opening | None]:
        """The opening read into the target and the draft model, now, before any request (opening.py says why)."""
        if opening is True:
            ids = opening_ids(self.encode_prompt) if self.tokenizer.has_chat_template else []
        else:
            ids = list(opening or [])
        target = self.target.model
        ours = Opening.read(target, ids, self.prefill_chunk) if isinstance(target, Transformer) else None
        draft = self.draft.model if self.draft is not None else None
        if draft is target:
            return ours, ours
        theirs = Opening.read(draft, ids, DRAFT_PREFILL_CHUNK) if isinstance(draft, Transformer) else None
        return ours, theirs

    def drafter(self, name: str | Drafter | None) -> Drafter | None:
        """The engine's drafter of that name (made once, kept with its state), or None for plain decoding."""
        return build_drafter(self, self._drafters, name)

    @staticmethod
    def resolve_max_k(max_k: int | None, drafter: Drafter | None) -> int:
        """The caller's largest K, or the drafter's own default (prompt lookup copies longer runs)."""
        if max_k is not None:
            if not isinstance(max_k, int) or isinstance(max_k, bool) or not 1 <= max_k <= MAX_K:
                raise InputError(f"max_k must be an integer in 1..{MAX_K}, got {max_k!r}")
            return max_k
        return (drafter or Drafter).traits.max_k

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
        return self.tokenizer.encode_prompt(text)

    # ----------------------------------------------------------------- public API
    def generate(self, prompt, **kwargs) -> GenerationResult:
        events = list(self.stream(prompt, **kwargs))
        return collect_result(events, list(self.last_prompt_ids))

    def stream(self, prompt, **settings) -> Iterator[StreamEvent]:
        """Generate, one event per speculative step (settings: see `request`)."""
        return self._loop(self.request(prompt, **settings))

    def request(
        self,
        prompt,
        *,
        drafter: str | Drafter | None = "auto",
        k: int | str = "auto",
        sampling: SamplingParams | None = None,
        max_new_tokens: int = 256,
        stop: tuple[str, ...] | list[str] = (),
        chat: bool | None = None,
        min_confidence: float = 0.0,
        max_k: int | None = None,
        should_stop: Callable[[], bool] | None = None,
        namespace: str | None = "",
        controls: LogitControls | None = None,
        grammar: CheckedGrammar | None = None,
    ) -> Request:
        """A checked request (InputError names what is wrong). namespace: whose request this is; drafters that
        learn from earlier requests (suffix) propose only from the same namespace's. None: this request neither
        copies from earlier requests nor is kept for later ones. grammar: controls.grammar already compiled
        (grammar.check_grammar), as a server does while it tokenizes, so that this thread never compiles it."""
        sampling = sampling or SamplingParams()
        if not isinstance(max_new_tokens, int) or max_new_tokens < 1:
            raise InputError(f"max_new_tokens must be an integer >= 1, got {max_new_tokens!r}")
        if k != "auto" and (not isinstance(k, int) or isinstance(k, bool) or k < 0 or k > MAX_K):  # True is no K
            raise InputError(f"k must be 'auto' or an integer in 0..{MAX_K}, got {k!r}")
        prompt_ids = self.encode_prompt(prompt, chat)
        self.last_prompt_ids = prompt_ids
        if not prompt_ids:
            raise InputError("the prompt is empty")
        if len(prompt_ids) >= self.max_context:
            raise InputError(f"the prompt has {len(prompt_ids)} tokens; the context holds {self.max_context}")
        drafter_obj = self.drafter(drafter)
        max_k = max(1, min(self.resolve_max_k(max_k, drafter_obj), self.max_context - 2))
        if drafter_obj is not None and drafter_obj.traits.greedy_only and not sampling.greedy:
            raise InputError(f"drafter '{drafter_obj.name}' supports greedy decoding only; use a chain drafter for sampling")
        fixed_k = None if k == "auto" else int(k)
        # A verify block holds 1 + K * tokens_per_depth rows (a tree adds a runner-up beside each node); other
        # than the int8 target's, blocks past FLOAT32_CHUNKED_MAX_ROWS go through a GEMM that is not row-exact.
        if drafter_obj is not None and not (isinstance(self.target.model, Transformer) and self.target.model.int8):
            exact_k = max(1, (kernels.FLOAT32_CHUNKED_MAX_ROWS - 1) // drafter_obj.traits.tokens_per_depth)
            max_k = min(max_k, exact_k)
            fixed_k = None if fixed_k is None else min(fixed_k, exact_k)
        grammar = self._check_controls(controls, drafter_obj, grammar)
        return Request(tuple(prompt_ids), drafter if isinstance(drafter, Drafter) else (drafter_obj and drafter_obj.name),
                       fixed_k, max_k, sampling, max_new_tokens, tuple(stop or ()), min_confidence, namespace, should_stop,
                       controls, grammar)

    def _check_controls(self, controls: LogitControls | None, drafter: Drafter | None,
                        grammar: CheckedGrammar | None = None) -> CheckedGrammar | None:
        """The request's controls against this engine's model; their grammar compiled (see _compiled_grammar)."""
        if controls is None:
            return self._compiled_grammar(None, grammar)
        if not isinstance(controls, LogitControls):
            raise InputError(f"controls must be a LogitControls, got {type(controls).__name__}")
        vocab = self.target.vocab_size
        bad = [token for token, _ in controls.logit_bias if token >= vocab]
        if bad:
            raise InputError(f"logit_bias names token ids past this model's vocabulary (0..{vocab - 1}): {bad[:5]}",
                             param="logit_bias")
        if controls.shapes_rows and drafter is not None and drafter.traits.greedy_only:
            raise InputError(f"drafter '{drafter.name}' drafts token trees, which cannot carry penalties, logit bias"
                             " or a grammar; use a chain drafter (auto, lookup, suffix, draft)")
        return self._compiled_grammar(controls.grammar, grammar)

    def _compiled_grammar(self, spec, grammar: CheckedGrammar | None) -> CheckedGrammar | None:
        """`spec` compiled: `grammar` where the caller compiled it already (a server, off this thread), else here
        (InputError where it is bad)."""
        vocab = self.target.vocab_size
        if grammar is None:
            return None if spec is None else check_grammar(spec, self.tokenizer, vocab)
        if spec is None or not grammar.compiled_for(spec, vocab):  # the caller's bug, never the client's input
            raise ValueError("the compiled grammar given is not this request's grammar for this model")
        return grammar

    # ----------------------------------------------------------------- the loop
    def new_generation(self, request: Request, slot, drafter: Drafter | None) -> Generation:
        """A generation of `request` in `slot` (this engine, or a batch slot) with that slot's drafter: the
        drafter begins, and the adaptive K gets its costs if it lacks them."""
        stopper = Stopper(self.tokenizer, request.max_new_tokens, request.stop)
        generation = Generation(slot, request, drafter, stopper, self.row_controls(request), self.tuner.params)
        if self.inexact is not None:
            generation.stats.exact = False
            generation.stats.notes.append(f"not row-exact ({self.inexact}): speculative output may differ from plain"
                                          " decoding at near-ties")
        self.start_generation(generation)
        return generation

    def row_controls(self, request: Request) -> RowControls | None:
        """A new generation's controls at the start of its answer (None where the request has none)."""
        if request.controls is None:
            return None
        vocab = self.target.vocab_size
        matcher = None if request.grammar is None else request.grammar.new_matcher()
        return RowControls.start(request.controls, request.prompt_ids, vocab, matcher, self.tokenizer.eos_ids)

    def _loop(self, request: Request) -> Iterator[StreamEvent]:
        """Choose K, take a speculative step, learn from it, hand its text out; until the answer stops."""
        drafter = self.drafter(request.drafter)
        generation = self.new_generation(request, self, drafter)
        pending = generation.reuse_prefix()
        device = self.target.model.device
        for start in range(0, len(pending), self.prefill_chunk):
            chunk = pending[start : start + self.prefill_chunk]
            self.target.model(torch.tensor(chunk, device=device), self.cache, logits="none")
            generation.read(chunk)
        self.prefilled(generation)
        live = self._live_generation = object()
        if self.launch_ahead and plain_rows(generation):
            yield from self._decode_ahead(generation, live)
        else:
            yield from self._steps(generation, drafter, live)

    def _steps(self, generation: Generation, drafter, live: object) -> Iterator[StreamEvent]:
        while True:
            self._check_live(live)
            event = generation.step_alone(self.target.model)
            if self.check_invariants:
                self._assert_invariants(generation.sequence, drafter)
            yield event
            if event.finished:
                return

    def _decode_ahead(self, generation: Generation, live: object) -> Iterator[StreamEvent]:
        """Plain decoding on the GPU path, each step's pass launched from the device's token (its argmax, or its seeded
        draw: batch_ahead.next_tokens) before the step before it is read (batch_ahead.py): the host settles and hands
        out a step while the device runs the next.
        The same tokens: the row of a step after the answer ended is rolled back, as a rejected draft's. Where a
        pass cannot run so (off the GPU path), or no row is worth launching, the usual steps go on."""
        model, cache = self.target.model, self.cache
        logits = None
        if has_room(cache):
            logits = model.steps_from_device([cache], int64_to_device([generation.sequence[-1]], model.device))
        read_at = time.perf_counter()
        while logits is not None:
            start = cache.length - 1
            choice, feed = next_tokens([generation], logits)
            read = LaterRead(choice)
            self._check_live(live)
            after = model.steps_from_device([cache], feed) if next_row_pays(generation, cache) else None
            token = read.tolist()[0]
            now = time.perf_counter()
            seconds, read_at = now - read_at, now
            if after is not None:
                cache.length -= 1  # the next step's row: back once this step is settled and the answer goes on
            generation.settle(logits, start, seconds, solo=False, choice=[token])
            event = generation.publish()
            if self.check_invariants:
                self._assert_invariants(generation.sequence, None)
            if after is not None and not event.finished and generation.sequence[-1] == token:
                cache.length += 1
            else:
                after = None
            yield event
            if event.finished:
                return
            logits = after
        yield from self._steps(generation, None, live)

    def start_generation(self, generation: Generation) -> None:
        """Before the prompt is read: the drafter begins, and the adaptive K gets its costs if it lacks them."""
        drafter, stats, request = generation.drafter, generation.stats, generation.request
        if drafter is not None:
            # drops state from another sequence; keeps a shared prefix
            drafter.begin(generation.prompt_ids[:-1], request.namespace)
        if self.tuner.needs_costs(drafter, request.fixed_k, request.max_k):
            t0, timed = time.perf_counter(), pass_timings.measurements
            self.measure_costs(request.max_k, drafter)
            if pass_timings.measurements != timed:  # not when this machine's timings were read from the cache folder
                stats.notes.append(f"measured target/draft costs for the adaptive K once ({time.perf_counter() - t0:.1f}s,"
                                   " not in the timings; kept for later processes on this machine)")
        generation.started = time.perf_counter()
        # The draft model reads the prompt lazily, on its first proposal: a generation that never drafts
        # never pays for it. Nothing touches its cache before then, so what it lacks is fixed now.
        generation.unread = drafter.unread_tokens(generation.prompt_ids) if drafter is not None and drafter.traits.reads_prompt else 0

    def prefilled(self, generation: Generation) -> None:
        """The prompt is in the target cache: the generation's tuning starts, knowing what the prefill cost."""
        stats = generation.stats
        stats.time_prefill = time.perf_counter() - generation.started
        request = generation.request
        generation.tuning = self.tuner.start(generation.drafter, request.fixed_k, request.max_k, request.min_confidence,
                                             generation.unread, len(generation.prompt_ids), stats.time_prefill,
                                             request.namespace)

    def _check_live(self, live: object) -> None:
        # An engine holds one cache: a second stream started on it takes the cache over, and this one
        # must not resume on the other's keys and values.
        if self._live_generation is not live:
            raise InputError("this generation was interrupted: another generation started on the same engine,"
                             " which runs one at a time (finish one stream before starting the next)")

    def _assert_invariants(self, sequence: list[int], drafter) -> None:
        if self.cache.length != len(sequence) - 1:
            raise AssertionError(f"target cache holds {self.cache.length} tokens, expected {len(sequence) - 1}")
        if self.cached_ids != sequence[:-1]:
            raise AssertionError("target cache token record diverged from the sequence")
        model = drafter.model_drafter if drafter is not None else None
        if model is not None:
            if model.cache.length != len(model.cached) or model.cached != sequence[: len(model.cached)]:
                raise AssertionError("draft cache holds tokens that are not a prefix of the sequence")

    # ----------------------------------------------------------------- cost measurement
    def measure_costs(self, max_k: int | None, drafter: Drafter | None = None, repeats: int = 3) -> None:
        """Time target passes of 1..max_k+1 tokens (and a draft pass) on scratch positions, where this process has
        not timed them on these models yet (pass_timings)."""
        device = self.target.model.device
        max_k = self.resolve_max_k(max_k, drafter)
        scratch = self.target.model.new_cache(max_k + 40)
        max_k = max(1, min(max_k, scratch.max_len - 2))  # a model with a tiny context still gets measured
        warm_len = max(1, min(8, scratch.max_len - (max_k + 1)))
        self._time_target_blocks(sorted({1, 2, 3, max(1, max_k // 2) + 1, max_k + 1}), scratch, warm_len, repeats)
        model = drafter.model_drafter if drafter is not None else None
        if model is not None:
            warm = torch.zeros(warm_len, dtype=torch.long, device=device)
            measure = lambda: time_draft_pass(model.model, warm, repeats)  # noqa: E731
            self.tuner.costs.set_measured_draft(model.name, pass_timings.remembered(model.model, ("draft", warm_len), measure))

    def measure_batch_costs(self, max_rows: int, repeats: int = 3) -> None:
        """Time target passes of up to max_rows rows (a batch of several requests' blocks), where the cost model
        lacks them: the batch planner weighs each draft token against what its row adds to the pass."""
        sizes = [size for size in (4, 8, 16, 24, 32, 48, 64, 96, 128, 192, 256) if size <= max_rows] + [max_rows]
        sizes = [size for size in dict.fromkeys(sizes) if size not in self.tuner.costs.target]
        if sizes:
            self._time_target_blocks(sizes, self.target.model.new_cache(max(sizes) + 8), 8, repeats)

    def _time_target_blocks(self, sizes, scratch, warm_len: int, repeats: int) -> None:
        """The fastest of `repeats` target passes of each size, after the scratch cache's warm_len positions."""
        model = self.target.model
        warm = torch.zeros(warm_len, dtype=torch.long, device=model.device)
        filled = []  # the scratch positions every block follows, written once before the first timing

        def measure(size: int) -> float:
            if not filled:
                model(warm, scratch, logits="none")
                filled.append(warm_len)
            tokens = torch.zeros(size, dtype=torch.long, device=model.device)

            def target_pass():
                scratch.truncate(warm_len)
                model(tokens, scratch, logits="all").argmax(-1).tolist()

            return pass_timings.fastest(target_pass, repeats)

        for size in sizes:
            if warm_len + size <= scratch.max_len:
                seconds = pass_timings.remembered(model, ("target", warm_len, size), lambda: measure(size))
                self.tuner.costs.set_measured(size, seconds)


def time_draft_pass(draft_model, warm: torch.Tensor, repeats: int) -> float:
    """The fastest of `repeats` one-token draft passes after len(warm) positions."""
    cache = draft_model.new_cache(len(warm) + 1)
    draft_model(warm, cache, logits="none")

    def draft_pass():
        cache.truncate(len(warm))
        draft_model(warm[:1], cache, logits="last").argmax().item()

    draft_pass()
    return pass_timings.fastest(draft_pass, repeats)


def collect_result(events: list[StreamEvent], prompt_ids: list[int]) -> GenerationResult:
    """A whole generation from its stream of events."""
    text, tokens, origins, sources, logprobs = [], [], [], [], []
    for event in events:
        text.append(event.text)
        tokens.extend(event.tokens)
        origins.extend(event.origins)
        sources.extend(event.sources)
        logprobs.extend(event.logprobs)
    stats = events[-1].stats
    # A stop string found a step later can end the answer before a token already streamed.
    answer = stats.generated_tokens
    del tokens[answer:], origins[answer:], sources[answer:], logprobs[answer:]
    return GenerationResult("".join(text), tokens, origins, stats, prompt_ids, sources, logprobs)


def inexact_reason(model) -> str | None:
    """None where every row of a block is computed exactly as the row alone (the native CPU kernels); else why not."""
    if not isinstance(model, Transformer):
        return "the transformers adapter computes blocks with PyTorch's batched kernels"
    if model.exact_pass is not None:
        return None
    if model.device.type != "cpu":
        return f"on {model.device.type}, batched matmuls and attention round differently from single rows"
    if kernels.load_kernel() is None:
        return f"the native CPU kernel is unavailable ({kernels.kernel_status()})"
    return None


def check_same_tokenizer(target: LoadedModel, draft: LoadedModel) -> int | None:
    """Refuse a draft whose tokenizer differs from the target's (one line, before anything is drafted). Where the
    tokenizers agree but the embedding tables are padded to different lengths (Qwen2.5 0.5B's 151,936 rows, 7B's
    152,064), returns how many ids the draft may propose: the real tokens both models score; else None."""
    reason = target.tokenizer.difference(draft.tokenizer)
    if reason is not None:
        raise ModelError(f"draft '{draft.name}' and target '{target.name}' use different tokenizers ({reason});"
                         " speculation needs the same one")
    if draft.vocab_size == target.vocab_size:
        return None
    if not isinstance(draft.model, Transformer):
        raise ModelError(
            f"draft '{draft.name}' scores {draft.vocab_size} tokens but target '{target.name}' scores {target.vocab_size}"
            " (padded rows are masked for native drafts only)"
        )
    return min(draft.vocab_size, target.vocab_size, target.tokenizer.real_vocab_end)
