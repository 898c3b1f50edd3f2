"""Partial rollouts: a call aborted at a weight sync is continued from its token history.

With ``GatewayConfig.partial_rollouts`` a pause aborts the calls in flight instead of draining
them (``UpstreamSender.abort_upstreams``: each upstream answers them at once with ``finish_reason =
"abort"`` and the tokens sampled so far). Each aborted call keeps those tokens and parks
(``CallLedger.park``) until the gateway resumes at the new weight version; it is then re-sent as
a continuation to ``/completions``: the prompt ids plus every id generated so far, ``max_tokens``
reduced by their number. It may be aborted again at a later sync. The agent gets one answer whose
token ids are the concatenation of the parts (exactly the ids sampled, nothing re-tokenized) with
each token's own sampler logprob, and the call's one trace says which version sampled which
tokens: ``weight_version`` is the oldest (the staleness bound holds for the whole call) and
``metadata["version_spans"]`` is ``[[version, token count], ...]`` in completion order.

A chat call the upstream renders itself (plain mode) is re-sent whole on the new weights: the
upstream renders its chat template and parses its reply (tool calls, reasoning), so continuing
it through ``/completions`` would need the gateway to render and parse exactly as the upstream
does, which is cumulative mode (there chat calls are continued). The re-sent call is sampled
wholly by the new version, so its trace stays token-true with one version; what the aborted send
had sampled is dropped (``metadata["partial_restarts"]`` counts the re-sends). Streamed calls
to ``/completions`` are continued on the client's one stream (``rllm.gateway.partial_stream``);
a chat stream the upstream renders itself is refused (400): its text already reached the agent,
so it can be neither restarted whole nor continued. ``n > 1`` calls are refused (400): each of
``n`` choices would need its own continuation. A ``stop`` string split across the boundary of
two parts is not seen by the sampler.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import msgspec

from rllm.gateway.capture import Captured, UpstreamShapeError, read_answer
from rllm.gateway.errors import GatewayError

if TYPE_CHECKING:
    from rllm.gateway.calls import ParsedCall, ProxyCall
    from rllm.gateway.ports import ProxyPort
    from rllm.runtime.http_messages import Response
    from rllm.types import SamplingParams

VERSION_SPANS = "version_spans"
_json_decode = msgspec.json.Decoder().decode
_json_encode = msgspec.json.Encoder().encode


def check_partial_call(
    parsed: ParsedCall, default_sampling: SamplingParams | None, *, continues: bool = True
) -> None:
    """Refuse (400, before any trace) a call that partial rollouts could not continue.
    ``continues``: the call goes to ``/completions`` (a completions call, or a chat call the
    gateway renders in cumulative mode), so it can be continued from its token ids."""
    body = parsed.body
    if body.get("stream") and not continues:
        raise GatewayError(
            400,
            "a chat stream the upstream renders itself (tokenizer_mode='plain') cannot be continued "
            "after a weight sync aborts it (its text already reached the client); send stream=false, "
            "or use tokenizer_mode='cumulative'",
            param="stream",
        )
    if body.get("n") not in (None, 1):
        raise GatewayError(
            400, "partial rollouts continue one choice per call; send n=1 (or several calls)", param="n"
        )
    sampling = parsed.session.sampling or default_sampling
    if (
        (sampling is None or sampling.max_tokens is None)
        and body.get("max_tokens") is None
        and body.get("max_completion_tokens") is None
    ):
        raise GatewayError(
            400,
            "partial rollouts need max_tokens on every call (a call continued after a weight sync "
            "gets what is left of it)",
            param="max_tokens",
        )


@dataclass(slots=True)
class _Part:
    """What one send of the call produced before it was aborted."""

    version: int
    choice: dict[str, Any]
    cap: Captured


async def forward_partial(proxy: ProxyPort, call: ProxyCall, parsed: ParsedCall) -> Response:
    """Forward a non-streaming call; each time it comes back aborted, park it and continue it."""
    ledger = proxy.ledger
    continues = call.path == "/completions"
    first = call.body
    version = ledger.weight_version if call.trace.weight_version is None else call.trace.weight_version
    parts: list[_Part] = []
    restarts = 0
    while True:
        status, raw = await proxy.sender.send_whole(call)
        aborted = _aborted_part(raw, version) if status == 200 else None
        if aborted is None:
            break
        if continues:
            if aborted.cap.prompt_ids is None or aborted.cap.completion_ids is None:
                why = "the upstream aborted the call without its token ids; it cannot be continued"
                ledger.fail(call.trace, call.t0, why)
                raise GatewayError(502, why, code="upstream_error")
            parts.append(aborted)
        else:
            restarts += 1
        try:
            await ledger.park()
        except BaseException:  # cancelled while parked: the call still leaves its one trace
            ledger.finish_trace(call.trace, None, "abort", call.t0)
            raise
        ledger.refuse_if_session_ended(call, "waited to be continued; it was discarded")
        version = ledger.weight_version
        call.body = _continuation(first, parts) if continues else first
    trace = call.trace
    if restarts:
        trace.metadata["partial_restarts"] = restarts
        trace.weight_version = version
    if parts:
        spans = [[p.version, len(p.cap.completion_ids or ())] for p in parts]
        if status == 200:
            raw, last = _joined(proxy, parts, raw, version)
            spans.append([version, last])
        spans = [s for s in spans if s[1]]
        trace.metadata[VERSION_SPANS] = spans
        trace.weight_version = spans[0][0] if spans else version
    return proxy.answer_whole(call, status, raw)


def _aborted_part(raw: bytes, version: int) -> _Part | None:
    """The answer as an aborted part, or None when it is anything else (a finished answer, or
    one answer_whole will refuse with its reason)."""
    try:
        data = _json_decode(raw)
        choice = data["choices"][0]
        if not isinstance(choice, dict) or choice.get("finish_reason") != "abort":
            return None
        cap = read_answer(data, chat=False)
        if cap.completion_ids is None and choice.get("token_ids") == []:
            cap.completion_ids = []  # aborted before its first token (still queued): nothing to keep
        return _Part(version, choice, cap)
    except (msgspec.DecodeError, KeyError, IndexError, TypeError, UpstreamShapeError):
        return None


def _max_tokens(body: dict[str, Any]) -> int:
    value = body.get("max_tokens", body.get("max_completion_tokens"))
    if not isinstance(value, int):  # check_partial_call refused calls without it
        raise GatewayError(400, "partial rollouts need max_tokens on every call", param="max_tokens")
    return value


def _continuation(first: dict[str, Any], parts: list[_Part]) -> dict[str, Any]:
    """The first body, its prompt extended by every id generated so far, its budget reduced."""
    body = copy.copy(first)
    generated = [t for p in parts for t in p.cap.completion_ids or ()]
    prompt = parts[0].cap.prompt_ids or []
    body["prompt"] = [*prompt, *generated]
    body.pop("max_completion_tokens", None)
    # An aborted row stopped before its budget ran out, so at least one token is left.
    body["max_tokens"] = max(1, _max_tokens(first) - len(generated))
    return body


def _joined(proxy: ProxyPort, parts: list[_Part], raw: bytes, version: int) -> tuple[bytes, int]:
    """The final answer with every part's ids, logprobs and text in front of its own, as if the
    call had never been aborted (the prompt is the first send's, the usage counts all tokens),
    and how many tokens the final send sampled."""
    try:
        data = _json_decode(raw)
        last = data["choices"][0]
        final = read_answer(data, chat=False)
    except (msgspec.DecodeError, KeyError, IndexError, TypeError, UpstreamShapeError):
        return raw, 0  # answer_whole refuses it with the reason
    prompt = parts[0].cap.prompt_ids or []
    ids = [t for p in parts for t in p.cap.completion_ids or ()] + list(final.completion_ids or ())
    texts = [p.cap.text for p in parts] + [final.text]
    last["token_ids"] = ids
    last["text"] = _joined_text(proxy, [*parts, _Part(version, last, final)], texts)
    if "prompt_token_ids" in last:
        last["prompt_token_ids"] = prompt
    if "prompt_token_ids" in data:
        data["prompt_token_ids"] = prompt
    last["logprobs"] = _joined_logprobs(
        [p.choice.get("logprobs") for p in parts] + [last.get("logprobs")], texts
    )
    usage = data.get("usage")
    if isinstance(usage, dict):
        usage.update(
            prompt_tokens=len(prompt), completion_tokens=len(ids), total_tokens=len(prompt) + len(ids)
        )
    return _json_encode(data), len(final.completion_ids or ())


def _joined_text(proxy: ProxyPort, parts: list[_Part], texts: list[str]) -> str:
    """The parts' texts joined; with the gateway's tokenizer, the joined ids decoded instead (a
    character split across two parts decodes whole), unless a part's text is not its ids'
    plain decoding (a stop string cut it)."""
    bridge = proxy.bridge
    if bridge is None:
        return "".join(texts)
    decode = bridge.tokenizer.decode
    if any(
        decode(list(p.cap.completion_ids or ()), skip_special_tokens=True) != t
        for p, t in zip(parts, texts, strict=True)
    ):
        return "".join(texts)
    return decode([t for p in parts for t in p.cap.completion_ids or ()], skip_special_tokens=True)


def _joined_logprobs(each: list[Any], texts: list[str]) -> Any:
    """Completions logprobs of the parts, concatenated field by field (``text_offset`` shifted
    by the text before each part); None unless every part has them."""
    if not all(isinstance(lp, dict) for lp in each):
        return None
    out: dict[str, Any] = {}
    for key in ("tokens", "token_logprobs", "top_logprobs", "text_offset"):
        lists = [lp.get(key) for lp in each]
        if not all(isinstance(v, list) for v in lists):
            out[key] = None
            continue
        if key == "text_offset":
            shift, joined = 0, []
            for offsets, text in zip(lists, texts, strict=True):
                joined.extend(o + shift for o in offsets)
                shift += len(text)
            out[key] = joined
        else:
            out[key] = [x for v in lists for x in v]
    return out


__all__ = ["VERSION_SPANS", "check_partial_call", "forward_partial"]
