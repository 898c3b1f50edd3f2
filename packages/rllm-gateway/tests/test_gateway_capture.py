"""Capture parsing for vLLM and SGLang response shapes, and stripping of injected fields."""

from __future__ import annotations

import aiohttp

from rllm.gateway.capture import ClientWants, StreamCapture, capture_response, inject_capture, strip_injected


def test_vllm_chat_shape():
    resp = {
        "model": "m",
        "prompt_token_ids": [1, 2],
        "choices": [
            {
                "message": {"content": "hi", "reasoning_content": "think"},
                "token_ids": [5, 6],
                "logprobs": {"content": [{"logprob": -0.1}, {"logprob": -0.2}]},
                "finish_reason": "stop",
            }
        ],
    }
    cap = capture_response(resp, chat=True)
    assert (cap.prompt_ids, cap.completion_ids, cap.completion_logprobs) == ([1, 2], [5, 6], [-0.1, -0.2])
    assert (cap.text, cap.reasoning, cap.finish_reason) == ("hi", "think", "stop")
    assert strip_injected(resp, ClientWants(logprobs=False, token_ids=False))
    assert "prompt_token_ids" not in resp and "token_ids" not in resp["choices"][0]
    assert resp["choices"][0]["logprobs"] is None


def test_vllm_completions_shape_and_sglang_meta_info():
    cmpl = {
        "choices": [
            {
                "text": "ab",
                "prompt_token_ids": [9],
                "token_ids": [3, 4],
                "logprobs": {"token_logprobs": [-1.0, -2.0], "tokens": ["a", "b"]},
            }
        ]
    }
    cap = capture_response(cmpl, chat=False)
    assert (cap.prompt_ids, cap.completion_ids, cap.completion_logprobs, cap.text) == (
        [9],
        [3, 4],
        [-1.0, -2.0],
        "ab",
    )
    sglang = {
        "choices": [
            {
                "message": {"content": "x"},
                "meta_info": {
                    "input_token_ids": [7, 8],
                    "output_token_logprobs": [[-0.5, 11, "x"], [-0.25, 12, "y"]],
                },
            }
        ]
    }
    cap = capture_response(sglang, chat=True)
    assert (cap.prompt_ids, cap.completion_ids, cap.completion_logprobs) == ([7, 8], [11, 12], [-0.5, -0.25])


def test_inject_remembers_what_the_client_asked_for():
    body = {"messages": [], "logprobs": True}
    wants = inject_capture(body, chat=True, stream=False)
    assert wants.logprobs and not wants.token_ids and body["return_token_ids"] is True
    body = {"prompt": "x"}
    wants = inject_capture(body, chat=False, stream=False)
    assert not wants.logprobs and body["logprobs"] == 1


def test_stream_capture_merges_tool_call_deltas():
    sc = StreamCapture(chat=True)
    sc.feed(
        {
            "prompt_token_ids": [1],
            "choices": [
                {
                    "index": 0,
                    "delta": {"content": "a"},
                    "token_ids": [2],
                    "logprobs": {"content": [{"logprob": -0.5}]},
                }
            ],
        }
    )
    sc.feed(
        {
            "choices": [
                {
                    "index": 0,
                    "delta": {
                        "tool_calls": [
                            {"index": 0, "id": "c1", "function": {"name": "f", "arguments": '{"a'}}
                        ]
                    },
                }
            ]
        }
    )
    sc.feed(
        {
            "choices": [
                {
                    "index": 0,
                    "delta": {"tool_calls": [{"index": 0, "function": {"arguments": '": 1}'}}]},
                    "finish_reason": "tool_calls",
                }
            ]
        }
    )
    cap = sc.result()
    assert (
        cap.text == "a"
        and cap.prompt_ids == [1]
        and cap.completion_ids == [2]
        and cap.completion_logprobs == [-0.5]
    )
    assert cap.tool_calls == [
        {"id": "c1", "type": "function", "function": {"name": "f", "arguments": '{"a": 1}'}}
    ]
    assert cap.finish_reason == "tool_calls"


async def test_first_stream_bytes_arrive_before_the_upstream_finishes(client, gateway, mock):
    mock.chunk_delay = 0.05  # ~20 tokens, spaced out
    body = {"model": "m", "messages": [{"role": "user", "content": "x" * 12}], "stream": True}
    url = f"{client.session_url('ff')}/chat/completions"
    async with aiohttp.ClientSession() as http, http.post(url, json=body) as r:
        first = await r.content.readany()
        # Bytes reached the client while the upstream was still generating: no trace yet.
        assert first.startswith(b"data: ")
        assert await gateway.store.get("ff") == []
        rest = await r.read()
    assert rest.endswith(b"data: [DONE]\n\n")
    (t,) = await gateway.store.get("ff")
    assert t.status == "ok"
