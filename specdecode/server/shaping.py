"""A generation's steps shaped as OpenAI answers: one JSON body, or server-sent chunks.

Both carry an extra "specdecode" field with the tokens, their origin (accepted / recovered / bonus / plain),
their source and the running statistics; the playground colours tokens from it.
"""
from __future__ import annotations

import asyncio
import json
import time
import uuid
from dataclasses import dataclass

from .logprobs import chat_logprobs, completion_logprobs
from .protocol import GenerationRequest
from .scheduler import Step
from .tools import ToolCallStream, chat_message, finish_reason

# Figures a client could read other clients' activity from: how long its prefill took and how much of its prompt was
# cached (its own earlier prefix is still in a slot unless others' requests took it), what the passes it shared cost,
# whether it paid for a calibration. Out of responses unless --expose-timings.
TIMING_STATS = frozenset({"tokens_per_s", "time", "predicted_speedup", "notes", "cached_tokens"})


# Past this many characters, the answer of a request with tools is parsed (tools.py) in a worker thread: linear in
# the answer, but a few milliseconds per hundred kilobytes, and n choices add up; meanwhile the event loop goes on
# serving every other client (their streams, /health).
LONG_ANSWER_CHARS = 32 * 1024


async def parsed_off_the_loop_if_long(text: str, parse, *args):
    """parse(*args), which reads the calls in `text`; in a worker thread when `text` is long."""
    if len(text) <= LONG_ANSWER_CHARS:
        return parse(*args)
    return await asyncio.to_thread(parse, *args)


def client_stats(stats: dict, expose_timings: bool) -> dict:
    """A generation's statistics as a client may see them."""
    return dict(stats) if expose_timings else {k: v for k, v in stats.items() if k not in TIMING_STATS}


def usage_of(stats: dict, expose_timings: bool = False) -> dict:
    usage = {
        "prompt_tokens": stats["prompt_tokens"],
        "completion_tokens": stats["generated_tokens"],
        "total_tokens": stats["prompt_tokens"] + stats["generated_tokens"],
        **{name: stats[name] for name in ("drafter", "drafted", "accepted", "alpha", "tau", "target_passes")},
        # OpenAI's shape always; the figure only where timings are exposed (TIMING_STATS says why)
        "prompt_tokens_details": {"cached_tokens": stats.get("cached_tokens", 0) if expose_timings else 0},
    }
    if expose_timings:
        usage["tokens_per_s"] = stats["tokens_per_s"]
    return usage


def fingerprint(engine) -> str:
    """OpenAI's system_fingerprint: what decides an answer's bits besides the request (the model file, its precision
    and backend, the device, the instruction-set paths the kernels run, whether blocks are row-exact), so a client
    can tell that two answers came from the same configuration. The draft model is not in it: output is lossless."""
    import hashlib

    from ..kernels import quant_isa_paths

    target = engine.target
    parts = [target.name, target.path.name, target.precision, target.backend,
             str(getattr(target.model, "device", "cpu")), ",".join(quant_isa_paths()), str(engine.inexact)]
    return "fp_" + hashlib.sha256("\n".join(parts).encode("utf-8", "surrogatepass")).hexdigest()[:12]


def response_logprobs(gen: GenerationRequest, entries: list[dict], text_offset: int = 0) -> dict | None:
    """The choice's `logprobs` field: None unless the request asked for them."""
    if gen.controls is None or gen.controls.logprobs is None:
        return None
    return chat_logprobs(entries) if gen.kind == "chat" else completion_logprobs(entries, text_offset)


@dataclass
class Gathered:
    """A whole generation, as the steps brought it."""

    text: str
    last: Step
    tokens: list[int]
    origins: list[str]
    sources: list[str]
    logprobs: list[dict]


async def gather_steps(ticket, watch) -> Gathered:
    """Every step of a generation until its last (watch.wait raises ClientGone when the client leaves)."""
    text, tokens, origins, sources, logprobs = [], [], [], [], []
    while True:
        message = await watch.wait(ticket.next())
        if message[0] == "error":
            raise message[1]
        step: Step = message[1]
        text.append(step.text)
        tokens.extend(step.tokens)
        origins.extend(step.origins)
        sources.extend(step.sources)
        logprobs.extend(step.logprobs)
        if step.finished:
            break
    # A stop string completed a step later can withdraw tokens already handed on: keep the answer's own.
    answer = step.stats["generated_tokens"]
    del tokens[answer:], origins[answer:], sources[answer:], logprobs[answer:]
    return Gathered("".join(text), step, tokens, origins, sources, logprobs)


def sse(payload) -> str:
    return f"data: {json.dumps(payload, ensure_ascii=False)}\n\n"


def response_id(kind: str) -> str:
    return ("chatcmpl-" if kind == "chat" else "cmpl-") + uuid.uuid4().hex


@dataclass(frozen=True)
class Shaper:
    """How this server shapes answers: its model's name, and whether clients see timings."""

    model_name: str
    expose_timings: bool = False
    fingerprint: str | None = None  # system_fingerprint (None where the engine is elsewhere: a cluster's entry point)

    def completion_body(self, gen: GenerationRequest, done: Gathered) -> dict:
        """The whole answer of a request that did not ask to stream."""
        step = done.last
        if gen.kind == "chat" and gen.tools:
            message, reason = chat_message(done.text, step.finish_reason, gen.tools, gen.parallel_tool_calls)
        elif gen.kind == "chat":
            message, reason = {"role": "assistant", "content": done.text}, step.finish_reason
        else:
            message, reason = None, step.finish_reason
        choice = {"index": 0, **({"message": message} if message is not None else {"text": done.text}),
                  "logprobs": response_logprobs(gen, done.logprobs), "finish_reason": reason}
        extension = {"tokens": done.tokens, "origins": done.origins, "sources": done.sources,
                     "stats": client_stats(step.final_stats.to_dict(), self.expose_timings)}
        if step.replica is not None:
            extension["replica"] = step.replica
        return {"id": response_id(gen.kind), "object": "chat.completion" if gen.kind == "chat" else "text_completion",
                "created": int(time.time()), "model": self.model_name, "choices": [choice],
                "usage": usage_of(step.stats, self.expose_timings), "system_fingerprint": self.fingerprint,
                "specdecode": extension}

    def step_extension(self, step: Step) -> dict:
        extension = {"tokens": step.tokens, "origins": step.origins, "sources": step.sources, "pieces": step.pieces,
                     "stats": client_stats(step.stats, self.expose_timings)}
        if step.replica is not None:
            extension["replica"] = step.replica
        return {"specdecode": extension}


class ChunkStream:
    """One streamed answer's chunks in OpenAI's shape (chat deltas or completion text), tool calls as deltas."""

    def __init__(self, shaper: Shaper, gen: GenerationRequest, index: int = 0, response: str | None = None,
                 usages: list | None = None):
        """For one choice of several (usages given): its chunks carry its index and the joined response's id, its
        usage goes to `usages` at the end, and the joined stream (choices.py) sends the usage and [DONE]."""
        self.shaper = shaper
        self.gen = gen
        self.index = index
        self.usages = usages
        self.id = response or response_id(gen.kind)
        self.created = int(time.time())
        self.streamed = 0  # characters of token text sent so far (the completions API's text offsets)
        self.calls = ToolCallStream(gen.parallel_tool_calls, gen.tools) if gen.kind == "chat" and gen.tools else None

    def chunk(self, text: str | None, finish_reason=None, extra=None, role=False, delta=None, logprobs=()) -> dict:
        described = response_logprobs(self.gen, list(logprobs), self.streamed)
        self.streamed += sum(len(entry["token"]) for entry in logprobs)
        if self.gen.kind == "chat":
            if delta is None:
                delta = {"role": "assistant", "content": ""} if role else ({} if text is None else {"content": text})
            choice = {"index": self.index, "delta": delta, "logprobs": described, "finish_reason": finish_reason}
        else:
            choice = {"index": self.index, "text": text or "", "logprobs": described, "finish_reason": finish_reason}
        payload = {"id": self.id, "object": "chat.completion.chunk" if self.gen.kind == "chat" else "text_completion",
                   "created": self.created, "model": self.shaper.model_name,
                   "system_fingerprint": self.shaper.fingerprint,
                   "choices": [choice]}
        payload.update(extra or {})
        return payload

    def step_chunks(self, step: Step) -> list[dict]:
        """The chunks of one step: its text (or tool-call deltas), then, after the last step and only where the
        request asked (stream_options.include_usage), one chunk with the usage and no choices, as OpenAI sends it.
        The last text chunk carried the usage too: clients that add up every chunk's usage (LangChain) counted twice."""
        extra = self.shaper.step_extension(step)
        if step.finished and self.usages is not None:  # one choice of several: its usage joins the others'
            self.usages.append(usage_of(step.stats, self.shaper.expose_timings))
        if self.calls is not None:  # text outside calls as content, each call as tool_calls deltas
            deltas = self.calls.feed(step.text) + (self.calls.finish() if step.finished else [])
            reason = finish_reason(step.finish_reason, len(self.calls.completed)) if step.finished else None
            chunks = [self.chunk(None, delta=delta) for delta in deltas[:-1]]
            chunks.append(self.chunk(None, reason, extra, delta=deltas[-1] if deltas else {}, logprobs=step.logprobs))
        else:
            chunks = [self.chunk(step.text if step.text or not step.finished else None,
                                 step.finish_reason if step.finished else None, extra, logprobs=step.logprobs)]
        if step.finished and self.gen.include_usage and self.usages is None:
            chunks.append({**self.chunk(None), "choices": [], "usage": usage_of(step.stats, self.shaper.expose_timings)})
        return chunks

    async def events(self, ticket):
        """Server-sent events until the generation ends; an error after the headers went out is reported in the
        stream, as OpenAI does."""
        if self.gen.kind == "chat":
            yield sse(self.chunk(None, role=True))
        while True:
            message = await ticket.next()
            if message[0] == "error":
                yield sse(message[1].body())
                break
            step: Step = message[1]
            if not (step.text or step.tokens or step.finished):
                continue
            for chunk in self.step_chunks(step):
                yield sse(chunk)
            if step.finished:
                break
        if self.usages is None:
            yield "data: [DONE]\n\n"
