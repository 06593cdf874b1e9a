"""Every decay, prior, clamp and threshold the adaptive layer uses, in one frozen record.

The tuner, the draft-length policy, the stop rules and the batch planner read their constants from a
`TuningParams` (the module's `DEFAULT` unless one is passed in), so an experiment changes one value in one
place. None of these numbers changes what is output: they decide only how much is drafted and verified.
"""
from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class TuningParams:
    # --- measured costs (CostModel)
    cost_smoothing: float = 0.2  # weight of a new timing in a block size's running cost: one slow pass moves it a fifth
    cost_stall: float = 2.0  # a timing over this multiple of the estimate counts as this multiple: a stall, not a cost

    # --- acceptance of i.i.d. drafts (AcceptanceEstimate)
    acceptance_prior: float = 0.6  # before any evidence: a typical draft's per-token acceptance
    acceptance_prior_weight: float = 2.0  # the prior counts as two tested tokens, so the first steps decide quickly
    acceptance_decay: float = 0.95  # per step: an answer changes character over ~20 steps, older steps fade

    # --- whether drafting pays (DraftLengthPolicy)
    probe_every: int = 12  # after this many plain steps (or refused chances), drafting is tried once more
    probe_k: int = 2  # an i.i.d. probe drafts this many tokens: cheap, and enough to see acceptance return
    copy_probe_every: int = 12  # a copy source's first token refused this many times in a row is verified anyway
    rate_decay: float = 0.85  # per drafting step, for the measured tokens/second of drafting steps
    prior_speedup: float = 1.2  # a new drafter is assumed to run this much faster than plain decoding ...
    prior_steps: float = 3.0  # ... worth this many steps, so one unlucky step does not switch drafting off
    prior_speedup_range: tuple[float, float] = (0.7, 1.5)  # a remembered speedup, clamped: no history is final
    remembered_speedup_keep: float = 0.6  # weight of the older generations in the remembered speedup
    min_steps_to_remember: int = 3  # drafting steps a generation needs before its speedup is remembered

    # --- a draft model within one request (GenerationTuning.model_pays, ChainCap)
    request_prior_steps: float = 3.0  # steps' worth of the prior speedup beside this request's own model steps:
    # one failed probe does not outweigh it, two do, so a request the draft predicts badly stops within a few passes
    probe_chain: int = 2  # a request's first model draft is at most this long; it doubles while drafts are accepted

    # --- confidence against acceptance (ConfidenceCalibration)
    calibration_bins: int = 10  # bins of the draft's confidence, each learning its own acceptance rate
    calibration_prior_weight: float = 4.0  # each bin starts at its centre, worth four judged tokens

    # --- a generation's own first draft tokens (DraftStopRule.first_token_factor)
    first_token_prior: float = 2.0  # tokens' worth of the prior that this generation behaves like earlier ones
    first_token_decay: float = 0.98  # per judged draft
    first_token_carry: float = 4.0  # expected tokens' worth of a client's earlier first-token record a request starts
    # from (0: each request starts neutral); see DraftStopRule.start_from

    # --- reading the prompt into a draft model (GenerationTuning.draft_prefill_pays)
    answer_credit: int = 32  # tokens an answer is assumed still to have before it has shown more
    # ... where auto would read the prompt into its draft model: copies may serve the answer's first tokens, and
    # a first-seen short answer (a translation, 17 tokens) never repaid the read (issue 66)
    auto_answer_credit: int = 16
    # ... and where this client's record says the draft model loses, a probe that must read the prompt first waits
    # until the read and two failed probe steps are at most this share of the request's time so far
    explore_read_share: float = 0.05
    probe_speedup_floor: float = 1.2  # a losing history still lets a probe explore, judged at this speedup
    prefill_min_tokens: int = 16  # shorter reads are mostly fixed overhead and say little about cost per token
    prefill_cost_keep: float = 0.5  # weight of the older measurement of the prefill cost per token

    # --- a request's record in a batch (batch_plan.AcceptanceRecord)
    batch_record_decay: float = 0.9  # per judged step
    batch_record_prior: float = 1.0  # tokens' worth of the prior that the calibration is right

    # --- notes in a generation's statistics
    low_alpha: float = 0.3  # below: speculation likely costs more than it saves
    moderate_alpha: float = 0.6  # below: a modest speedup at best
    min_drafted_for_note: int = 8  # drafted tokens before alpha says anything


DEFAULT = TuningParams()
