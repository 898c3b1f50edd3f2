"""``rllm doctor tokens MODEL``: token faithfulness of one model's tokenizer and chat template.

A conformance run through the real gateway in cumulative mode against a scripted upstream
(on loopback; or a real one with ``--upstream``). The scripted upstream answers each
``/v1/completions`` call like vLLM, with the ids the tokenizer gives the scripted reply plus
its end-of-turn token, so every check exercises the template and the gateway, not a model.

Each check is pass, fail or warn. A template that makes every turn a new segment (it re-renders
an earlier reply differently from the tokens the sampler produced) is a warning with its reason
and its cost in re-prefilled tokens per turn: training stays token-true (the gateway starts a
segment), but the run pays for it. Exit 0 unless a check fails (``--strict``: or warns).

This module runs the checks (``Doctor``) and holds the command; the scripted upstream is
``doctor_upstream.py``, the report and its table ``doctor_report.py``, the image check
``doctor_images.py``; ``rllm doctor run RUN_DIR`` (a training run's health) is ``doctor_run.py``.
"""

from __future__ import annotations

import asyncio
import json
import tempfile
import urllib.request
from typing import Any

import click
from rich.console import Console

from rllm.cli.doctor_report import Check, Report, first_diff, print_report
from rllm.cli.doctor_run import run_command
from rllm.cli.doctor_upstream import ScriptedUpstream
from rllm.cli.errors import FAILED, CliError
from rllm.runtime.hub_names import HubNameError

TINY = "tiny"


def load_tokenizer(model: str, tokenizer: str | None) -> tuple[Any, str, Any]:
    """The tokenizer MODEL trains with (``tiny``: rllm.tiny's), a directory holding it, and the
    gateway's ``ImageTokens`` where the model has an image processor (else None), loaded as the
    gateway loads them."""
    try:
        from rllm.gateway.cumulative import TokenBridge
    except ImportError as e:  # pragma: no cover - transformers is the gateway's tokenizer extra
        raise CliError(f"the doctor needs transformers: {e}") from e
    path = tokenizer or model
    if tokenizer is None and model == TINY:
        from rllm.tiny import build_tokenizer

        path = tempfile.mkdtemp(prefix="rllm-doctor-")
        build_tokenizer().save_pretrained(path)
    try:
        bridge = TokenBridge.load(path)
    except HubNameError as e:  # its line names the name and the cause: no hint to add
        raise CliError(str(e)) from None
    except (OSError, ValueError) as e:
        raise CliError(f"cannot load a tokenizer from {path!r}: {e}", hint="pass --tokenizer PATH") from e
    return bridge.tokenizer, path, bridge.images


def _post(url: str, body: dict[str, Any]) -> bytes:
    req = urllib.request.Request(
        url, data=json.dumps(body).encode(), headers={"Content-Type": "application/json"}, method="POST"
    )
    with urllib.request.urlopen(req, timeout=60) as r:
        return r.read()


def _extends(prev: Any, cur: Any) -> bool:
    prefix = list(prev.prompt_ids) + list(prev.completion_ids)
    return list(cur.prompt_ids[: len(prefix)]) == prefix


class Doctor:
    def __init__(
        self, tok: Any, path: str, upstream: str | None, tool_format: str | None, images: Any = None
    ) -> None:
        from rllm.gateway.toolcalls import HARMONY, detect_format

        self.tok, self.path, self.upstream = tok, path, upstream
        self.tool_format = tool_format or detect_format(tok)
        self.harmony = self.tool_format == HARMONY
        self.images = images  # the gateway's ImageTokens: the model has an image processor
        self._n = 0
        self.sent: list[tuple[list[dict[str, Any]], Any]] = []  # each call's messages, this conversation

    async def run(self, model: str) -> Report:
        from rllm.gateway import GatewayClient, GatewayConfig, GatewayServer

        report = Report(model, self.tool_format)
        async with ScriptedUpstream(self.tok) as scripted:
            self.scripted = scripted
            scripted.eos = not self.harmony
            cfg = GatewayConfig(
                upstreams=[self.upstream or scripted.url],
                tokenizer_path=self.path,
                tokenizer_mode="cumulative",
                health_interval_s=0,
            )
            async with GatewayServer(cfg) as gw, GatewayClient(gw.url) as client:
                self.gw, self.client = gw, client
                report.checks.append(await self.multi_turn())
                report.checks.append(await self.streaming())
                if self.images is not None and self.upstream is None:
                    from rllm.cli.doctor_images import images_check

                    report.checks.append(await images_check(self, self.images))
                elif self.images is not None:  # vLLM's /v1/completions takes no images with ids
                    why = "checked with the scripted upstream only: run without --upstream"
                    report.checks.append(Check("images (multi-turn)", "skip", why))
                if self.upstream is not None:  # a real model does not follow the script
                    why = "scripted replies only: run without --upstream"
                    report.checks.append(Check("tool calls", "skip", why))
                    return report
                if "think>" in str(self.tok.chat_template):  # the template claims reasoning turns
                    report.checks.append(await self.thinking())
                if self.harmony:  # gpt-oss reasons on the analysis channel
                    traces = await self.conversation(3, think=True)
                    report.checks.append(self._verdict("multi-turn with analysis", traces))
                report.checks.extend(await self.tools())
        return report

    async def chat(self, sid: str, messages: list[dict[str, Any]], reply: str, **kw: Any) -> dict[str, Any]:
        self.scripted.reply = reply
        self.sent.append(([dict(m) for m in messages], kw.get("tools")))
        url = self.client.session_url(sid) + "/chat/completions"
        body = {"model": "doctor", "messages": messages, "max_tokens": 64, "temperature": 0, **kw}
        raw = await asyncio.to_thread(_post, url, body)
        if kw.get("stream"):
            text = ""
            for line in raw.decode().splitlines():
                if line.startswith("data: ") and line != "data: [DONE]":
                    for c in json.loads(line[6:]).get("choices") or ():
                        text += (c.get("delta") or {}).get("content") or ""
            return {"role": "assistant", "content": text}
        msg = json.loads(raw)["choices"][0]["message"]
        return {k: v for k, v in msg.items() if k in ("role", "content", "tool_calls") and v is not None}

    def wrap(self, text: str, think: str | None = None) -> str:
        """What the model writes for an answer (after its reasoning ``think``), in its format."""
        if self.harmony:  # analysis, then the final channel, ended by <|return|> as gpt-oss does
            head = f"<|channel|>analysis<|message|>{think}<|end|><|start|>assistant" if think else ""
            return f"{head}<|channel|>final<|message|>{text}<|return|>"
        return f"<think>\n{think}\n</think>\n\n{text}" if think else text

    def sid(self) -> str:
        self._n += 1
        return f"doctor-{self._n}"

    async def thinking(self) -> Check:
        traces = await self.conversation(3, think=True)
        return self._verdict("multi-turn with thinking", traces)

    async def conversation(self, turns: int, think: bool = False, **kw: Any) -> list[Any]:
        sid = self.sid()
        self.sent = []
        msgs: list[dict[str, Any]] = [
            {"role": "system", "content": "you are an agent"},
            {"role": "user", "content": "say the word apple"},
        ]
        for i in range(turns):
            reply = self.wrap(f"the answer is {i}", f"say {i}" if think else None)
            msgs.append(await self.chat(sid, msgs, reply, **kw))
            msgs.append({"role": "user", "content": "say it again"})
        return await self.client.get_traces(sid)

    async def multi_turn(self) -> Check:
        traces = await self.conversation(3)
        return self._verdict("multi-turn text", traces)

    def _verdict(self, name: str, traces: list[Any]) -> Check:
        for k in range(1, len(traces)):
            if traces[k].segment == traces[k - 1].segment and not _extends(traces[k - 1], traces[k]):
                prev = list(traces[k - 1].prompt_ids) + list(traces[k - 1].completion_ids)
                diff = first_diff(self.tok, prev, list(traces[k].prompt_ids))
                return Check(name, "fail", f"turn {k + 1} claims to extend turn {k} but does not", diff)
        new = [t for t in traces[1:] if t.segment != 0 and t.metadata.get("segment_reason")]
        if not new:
            return Check(name, "pass", f"{len(traces)} turns, one segment")
        t = new[0]
        k = traces.index(t)
        prev = traces[k - 1]
        prefix = list(prev.prompt_ids) + list(prev.completion_ids)
        diff: dict[str, Any] | None = first_diff(self.tok, prefix, list(t.prompt_ids))
        cost = sum(len(x.prompt_ids) for x in new) // len(new)
        in_reply = diff["expected"] is not None and diff["index"] >= len(prev.prompt_ids)
        why = self._why(k, prev, t.metadata["segment_reason"], in_reply)
        if diff["expected"] is None:  # the ids extend; only the text comparison parts them
            why += " (its token ids happen to extend all the same: the gateway compares text)"
            diff = None
        return Check(
            name,
            "warn",
            f"this model starts a new segment every turn because {why}; "
            f"cost: ~{cost} prompt tokens re-prefilled per turn ({len(new)} of {len(traces)} turns)",
            diff,
        )

    def _why(self, k: int, prev: Any, reason: str, in_reply: bool = False) -> str:
        """The reason, with the text where the sampled turn and the re-rendered history part."""
        from rllm.gateway.toolcalls import to_template_messages

        def render(sent: tuple[list[dict[str, Any]], Any]) -> str:
            msgs, tools = sent
            return self.tok.apply_chat_template(
                to_template_messages(msgs), tools=tools, add_generation_prompt=True, tokenize=False
            )

        if k >= len(self.sent):
            return reason
        done = render(self.sent[k - 1]) + self.tok.decode(
            list(prev.completion_ids), skip_special_tokens=False
        )
        text = render(self.sent[k])
        at = zip(done, text, strict=False)
        i = next((j for j, (a, b) in enumerate(at) if a != b), min(len(done), len(text)))
        sampled, rendered = done[max(0, i - 20) : i + 12], text[max(0, i - 20) : i + 12]
        j = max(done.rfind("<|", 0, i + 1), 0)  # the special token the difference is in
        if "<think>" in done[i:] and "<think>" not in text[i:]:
            cause = "the chat template strips the thinking from earlier assistant turns"
        elif done[j:].startswith("<|channel|>analysis") and not text[j:].startswith("<|channel|>analysis"):
            cause = "the chat template drops the analysis channel of earlier assistant turns (gpt-oss)"
        elif done[j:].startswith("<|return|>") and text[j:].startswith("<|end|>"):
            cause = (
                "the chat template ends an earlier final answer with <|end|> where the model "
                "sampled <|return|> (harmony's rule for history)"
            )
        elif done[i:].startswith("<|channel|>") and text[i:].startswith(" to="):
            cause = (
                "the chat template writes a tool call's recipient in the role header "
                "('assistant to=functions.NAME<|channel|>commentary json') where the model writes "
                "it after the channel ('<|channel|>commentary to=functions.NAME <|constrain|>json')"
            )
        elif in_reply and not self._canonical(k, prev):
            cause = (
                "the sampler's tokens for its reply are not the tokenizer's own tokenization of "
                "that text (a non-canonical tokenization), so re-rendering changes them"
            )
        elif done[i : i + 1].isspace() != text[i : i + 1].isspace():
            cause = self._whitespace_cause(done[i:], text[i:])
        elif in_reply:  # canonical tokens, yet the template writes the reply's text differently
            cause = "the chat template renders an earlier reply differently from the text the model sampled"
        else:
            cause = reason
        return f"{cause}: the sampled text reads {sampled!r}, the template renders {rendered!r}"

    def _canonical(self, k: int, prev: Any) -> bool:
        """Whether turn ``k``'s previous reply, as the agent got it back, tokenizes to the ids the
        sampler produced (less its end-of-turn token): a sampler may emit others for the same text.
        A reply that is not plain text cannot be told, and is not blamed on the sampler."""
        before, after = self.sent[k - 1][0], self.sent[k][0]
        reply = after[len(before)] if len(after) > len(before) else {}
        content = reply.get("content") if isinstance(reply, dict) else None
        if not isinstance(content, str):
            return True
        ids = list(prev.completion_ids)
        if ids and ids[-1] == getattr(self.tok, "eos_token_id", None):
            ids = ids[:-1]
        return list(self.tok.encode(content, add_special_tokens=False)) == ids

    def _whitespace_cause(self, sampled: str, rendered: str) -> str:
        """The template's own whitespace change where the sampled and the re-rendered text part
        (one side has whitespace there, the other not), named with what it comes before."""
        added = rendered[:1].isspace()
        longer, other = (rendered, sampled) if added else (sampled, rendered)
        space = longer[: len(longer) - len(longer.lstrip())]
        ends = [t for t in (getattr(self.tok, "eos_token", None), "<|im_end|>", "<|eot_id|>", "<|end|>") if t]
        end = next((t for t in ends if other.startswith(t)), None)
        where = (
            f"before the end-of-turn token {end} of earlier assistant turns"
            if end is not None
            else "around an earlier reply"
        )
        return (
            f"the chat template {'adds' if added else 'drops'} whitespace ({space!r}) {where}: the "
            "template changes the text, the sampler's tokens are the tokenizer's own"
        )

    async def streaming(self) -> Check:
        plain = await self.conversation(2)
        streamed = await self.conversation(2, stream=True)
        for a, b in zip(plain, streamed, strict=True):
            for part in ("prompt_ids", "completion_ids"):
                x, y = list(getattr(a, part)), list(getattr(b, part))
                if x == y:
                    continue
                diff = first_diff(self.tok, x, y)
                return Check("streaming = non-streaming", "fail", f"{part} differ", diff)
        return Check("streaming = non-streaming", "pass", "same prompt and completion ids")

    async def tools(self) -> list[Check]:
        from rllm.gateway.toolcalls import HARMONY, HERMES, LLAMA3_JSON

        fmt = self.tool_format
        if fmt not in (HERMES, LLAMA3_JSON, HARMONY):
            why = "the template renders no tools" if fmt is None else f"{fmt} is not checked offline yet"
            return [Check("tool calls", "skip", why)]
        one = {"name": "get_weather", "arguments": {"city": "Paris"}}
        two = {"name": "get_weather", "arguments": {"city": "Rome"}}
        if fmt == HERMES:
            call = lambda c: "<tool_call>\n" + json.dumps(c) + "\n</tool_call>"  # noqa: E731
            single, parallel = call(one), call(one) + "\n" + call(two)
            malformed = '<tool_call>\n{"name": "get_weather", "arguments": \n</tool_call>'
        elif fmt == HARMONY:  # as gpt-oss writes a call: recipient after the channel, <|call|> ends it
            head = "<|channel|>commentary to=functions.get_weather <|constrain|>json<|message|>"
            call = lambda c: head + json.dumps(c["arguments"]) + "<|call|>"  # noqa: E731
            # gpt-oss stops at <|call|>; two calls in one completion come from a sampler that does not
            single, parallel = call(one), call(one) + "<|start|>assistant" + call(two)
            malformed = head + '{"city": <|call|>'
        else:
            call = lambda c: json.dumps({"name": c["name"], "parameters": c["arguments"]})  # noqa: E731
            single, parallel = call(one), None  # Llama 3.1's template renders one call per turn
            malformed = '{"name": "get_weather", "parameters": '
        out = [await self._tool_check("tool call: one", single, [one])]
        out.append(
            await self._tool_check("tool call: parallel", parallel, [one, two])
            if parallel
            else Check("tool call: parallel", "skip", "the template renders one call per message")
        )
        out.append(await self._tool_result(single))
        out.append(await self._malformed(malformed))
        return out

    async def _tool_check(self, name: str, reply: str, want: list[dict[str, Any]]) -> Check:
        from rllm.gateway.toolcalls import PROBE_TOOLS

        msgs = [{"role": "user", "content": "weather in paris"}]
        msg = await self.chat(self.sid(), msgs, reply, tools=PROBE_TOOLS)
        got = [
            {"name": c["function"]["name"], "arguments": json.loads(c["function"]["arguments"])}
            for c in msg.get("tool_calls") or ()
        ]
        if got != want:
            return Check(name, "fail", f"parsed {got}, expected {want}")
        return Check(name, "pass", f"{len(got)} call(s) parsed")

    async def _tool_result(self, reply: str) -> Check:
        from rllm.gateway.toolcalls import PROBE_TOOLS

        sid = self.sid()
        self.sent = []
        msgs: list[dict[str, Any]] = [{"role": "user", "content": "weather in paris"}]
        msg = await self.chat(sid, msgs, reply, tools=PROBE_TOOLS)
        calls = msg.get("tool_calls") or []
        msgs.append(msg)
        msgs.extend({"role": "tool", "tool_call_id": c["id"], "content": "sunny"} for c in calls)
        await self.chat(sid, msgs, self.wrap("it is sunny"), tools=PROBE_TOOLS)
        traces = await self.client.get_traces(sid)
        check = self._verdict("tool result (render -> parse -> render)", traces)
        if not calls:
            return Check(check.name, "fail", "the call was not parsed, so no result could follow")
        return check

    async def _malformed(self, reply: str) -> Check:
        from rllm.gateway.toolcalls import PROBE_TOOLS

        sid = self.sid()
        msg = await self.chat(
            sid, [{"role": "user", "content": "weather in paris"}], reply, tools=PROBE_TOOLS
        )
        traces = await self.client.get_traces(sid)
        err = traces[-1].metadata.get("tool_call_error")
        if msg.get("tool_calls") or not err:
            return Check(
                "tool call: malformed", "fail", "a malformed call was not reported as tool_call_error"
            )
        return Check("tool call: malformed", "pass", f"reported: {err}")


def run_doctor(model: str, tokenizer: str | None, tool_format: str | None, upstream: str | None) -> Report:
    tok, path, images = load_tokenizer(model, tokenizer)
    return asyncio.run(Doctor(tok, path, upstream, tool_format, images).run(model))


@click.group("doctor")
def doctor_group() -> None:
    """Check a model before training on it (tokens), or a training run's health (run)."""


@doctor_group.command("tokens")
@click.argument("model")
@click.option("--tokenizer", default=None, help="tokenizer folder or hub name (default: MODEL's)")
@click.option(
    "--tool-format",
    type=click.Choice(["hermes", "llama3_json", "harmony"]),
    default=None,
    help="tool-call format (default: detected from the chat template)",
)
@click.option("--upstream", default=None, help="a real OpenAI-compatible /v1 URL instead of the scripted one")
@click.option("--json", "as_json", is_flag=True, help="print the report as JSON (for CI)")
@click.option("--strict", is_flag=True, help="exit 1 on a warning too (a CI gate)")
def tokens_command(
    model: str,
    tokenizer: str | None,
    tool_format: str | None,
    upstream: str | None,
    as_json: bool,
    strict: bool,
) -> int:
    """Token faithfulness of MODEL's tokenizer and chat template through the gateway.

    MODEL is what a training config's `model` takes (`tiny`, a folder, a hub name). Checks
    multi-turn extension, streaming against non-streaming ids, and tool calls (one, parallel,
    a result, a malformed call) in the template's format. Exit 0 unless a check fails;
    a template that starts a new segment every turn is a warning with its cause and cost
    (with --strict a warning exits 1 as well).

    \b
    Example:
      rllm doctor tokens tiny
      rllm doctor tokens Qwen/Qwen2.5-0.5B-Instruct --json
      rllm doctor tokens ./my-model --strict
    """
    if upstream is not None and not upstream.startswith(("http://", "https://")):
        raise CliError(f"--upstream must be an http(s) URL ending in /v1, got {upstream!r}")
    report = run_doctor(model, tokenizer, tool_format, upstream)
    if as_json:
        click.echo(json.dumps(report.as_json(), indent=2))
    else:
        print_report(report, Console(highlight=False))
    warned = any(c.status == "warn" for c in report.checks)
    return 0 if report.ok and not (strict and warned) else FAILED


doctor_group.add_command(run_command)
