"""`n` > 1: several answers to one request, as OpenAI's chat completions and completions give them.

A request for n choices runs as n generations side by side in the batch (each with its own queue place):
choice i is the request with n = 1 and seed + i (`sampling.choice_seed`; without a seed each choice draws its
own randomness; greedy choices are all the same answer), so every choice equals that request alone, token
for token. The engine reads the shared prompt once and copies its keys and values into the other choices'
caches (batch.BatchEngine._share_prompts). Here the n answers are joined into one response: `choices[i]`
with its `index`, streamed chunks carrying their choice's index, usage counting the prompt once and the
completion tokens of every choice.
"""
from __future__ import annotations

import asyncio
import json
import logging
import time
from dataclasses import replace

from fastapi.responses import StreamingResponse

from ..sampling import choice_seed
from .protocol import ApiError, GenerationRequest

log = logging.getLogger("specdecode.server")


def check_choices(gen: GenerationRequest, max_batch: int) -> None:
    if gen.prompts and len(gen.prompts) * gen.n > max_batch:
        raise ApiError(400, f"{len(gen.prompts)} prompts with n = {gen.n} make {len(gen.prompts) * gen.n} answers; this"
                       f" server runs at most {max_batch} side by side (its batch size)", param="prompt", code="invalid_value")
    if gen.n > max_batch:
        raise ApiError(400, f"'n' must be <= {max_batch} on this server (its batch size: the choices run side by side),"
                       f" got {gen.n}", param="n", code="invalid_value")


def choice_requests(gen: GenerationRequest) -> list[GenerationRequest]:
    """The one-choice requests that make up `gen`: for each prompt (of a completions batch, else the one), its n
    choices; their order is OpenAI's choice index (prompt i's choice j at i * n + j)."""
    return [replace(gen, prompt=prompt, prompts=None, n=1, seed=choice_seed(gen.seed, index))
            for prompt in (gen.prompts or [gen.prompt]) for index in range(gen.n)]


def sum_usage(usages: list[dict], n: int) -> dict:
    """One request's usage from its choices' (n per prompt): each prompt once, every choice's completion tokens and
    drafting."""
    total = dict(usages[0])
    for name in ("completion_tokens", "drafted", "accepted", "target_passes"):
        total[name] = sum(u[name] for u in usages)
    total["prompt_tokens"] = sum(u["prompt_tokens"] for u in usages) // n  # a prompt's n choices count it alike
    total["total_tokens"] = total["prompt_tokens"] + total["completion_tokens"]
    total["alpha"] = total["accepted"] / total["drafted"] if total["drafted"] else None
    total["tau"] = total["completion_tokens"] / total["target_passes"] if total["target_passes"] else None
    total.pop("tokens_per_s", None)  # a rate of one choice; the choices ran together
    return total


async def run_choices(gen: GenerationRequest, run_one) -> list:
    """`await run_one(index, choice_request)` for every choice at once; on any error the others are cancelled."""
    tasks = [asyncio.ensure_future(run_one(index, request)) for index, request in enumerate(choice_requests(gen))]
    try:
        return await asyncio.gather(*tasks)
    except BaseException:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        for task in tasks:  # a streamed choice already started holds a generation of its own
            if not task.cancelled() and task.exception() is None and isinstance(task.result(), StreamingResponse):
                task.result().ticket.cancel("aborted")
        raise


def joined_body(bodies: list[dict], n: int) -> dict:
    """One response from the choices' own (each a whole response with one choice), n per prompt."""
    body = dict(bodies[0])
    body["choices"] = [dict(b["choices"][0], index=index) for index, b in enumerate(bodies)]
    body["usage"] = sum_usage([b["usage"] for b in bodies], n)
    body["specdecode"] = {"choices": [b["specdecode"] for b in bodies]}
    return body


def stream_end(gen: GenerationRequest, head: dict, usages: list[dict]):
    """The joined stream's last events: the usage of every choice (where asked for), then [DONE]."""
    if gen.include_usage and len(usages) == len(gen.prompts or [gen.prompt]) * gen.n:
        chunk = {**head, "created": int(time.time()), "choices": [],
                 "usage": sum_usage(usages, gen.n)}
        yield f"data: {json.dumps(chunk, ensure_ascii=False)}\n\n"
    yield "data: [DONE]\n\n"


class ChoicesStreamingResponse(StreamingResponse):
    """The choices' event streams as one; every choice's generation is cancelled however the response ends."""

    def __init__(self, parts: list[StreamingResponse], tail, **kwargs):
        super().__init__(merged(parts, tail), **kwargs)
        self.tickets = [part.ticket for part in parts]

    async def __call__(self, scope, receive, send):
        try:
            await super().__call__(scope, receive, send)
        finally:
            for ticket in self.tickets:
                ticket.cancel("client_disconnected")  # no-op where the generation finished


async def merged(parts: list[StreamingResponse], tail):
    """Each choice's events as they come (their chunks carry their choice's index), then `tail()`'s."""
    queue: asyncio.Queue = asyncio.Queue()

    async def pump(part):
        try:
            async for event in part.body_iterator:
                await queue.put(event)
        except Exception:
            log.exception("a choice's stream failed")
        finally:
            await queue.put(None)

    tasks = [asyncio.ensure_future(pump(part)) for part in parts]
    try:
        ended = 0
        while ended < len(parts):
            event = await queue.get()
            if event is None:
                ended += 1
            else:
                yield event
        for event in tail():
            yield event
    finally:
        for task in tasks:
            task.cancel()
