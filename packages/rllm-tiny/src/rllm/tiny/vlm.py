"""A tiny random-init Qwen2-VL and its processor parts, built locally (tests and toy tasks).

Nothing is downloaded: the tokenizer is :func:`rllm.tiny.build_tokenizer`'s word-level one plus
Qwen2-VL's vision tokens, and the image processor is Qwen2-VL's Pillow one built from its
parameters (Pillow needed). The parts are saved separately (tokenizer files +
``preprocessor_config.json``) and loaded with AutoTokenizer and :func:`load_image_processor`,
because transformers' combined Qwen2-VL processor also wants a video processor, which needs
torchvision.
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path
from typing import Any, cast

from rllm.tiny.tokenizer import TOOL_CALL_TOKENS, build_tokenizer
from rllm.types.errors import InputError

VISION_START, IMAGE_PAD, VISION_END = "<|vision_start|>", "<|image_pad|>", "<|vision_end|>"
VISION_TOKENS = [VISION_START, IMAGE_PAD, VISION_END]

# tiny.CHAT_TEMPLATE with content blocks: text as it is, each image as Qwen2-VL's
# "<|vision_start|><|image_pad|><|vision_end|>" (one pad, expanded per image by render_vlm_prompt).
# The generation prompt ends in the space the rendered assistant message has after its role
# tag, so the prompt text + a decoded reply ("word word <|end|>") is a prefix of the next turn's
# rendering: cumulative mode then extends multi-turn histories token for token.
VLM_CHAT_TEMPLATE = (
    "{% for message in messages %}{{ '<|' + message['role'] + '|> ' }}"
    "{% if message['content'] is string %}{{ message['content'] }}"
    "{% else %}{% for block in message['content'] %}"
    "{% if block['type'] == 'text' %}{{ block['text'] }}"
    "{% else %}{{ '<|vision_start|><|image_pad|><|vision_end|>' }}{% endif %}"
    "{% endfor %}{% endif %}{{ ' <|end|> ' }}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|assistant|> ' }}{% endif %}"
)


# VLM_CHAT_TEMPLATE with native tool calls, hermes style as tiny.TOOL_CHAT_TEMPLATE (the tools
# listed up front, calls as <tool_call>{json}</tool_call>, results as <|tool|> turns): for
# cookbooks whose vision agents call tools (e.g. the desktop cookbook).
VLM_TOOL_CHAT_TEMPLATE = (
    "{% if tools %}{{ '<|system|> tools : ' }}{% for tool in tools %}{{ tool | tojson + ' ' }}{% endfor %}"
    '{{ \'<tool_call> {"name": name, "arguments": arguments} </tool_call> <|end|> \' }}{% endif %}'
    "{% for message in messages %}"
    "{% if message['role'] == 'tool' %}{{ '<|tool|> ' + message['content'] + ' <|end|> ' }}"
    "{% elif message.get('tool_calls') %}{{ '<|assistant|> ' + (message['content'] or '') + ' ' }}"
    "{% for call in message['tool_calls'] %}{{ '<tool_call> ' + "
    "{'name': call['function']['name'], 'arguments': call['function']['arguments']} | tojson"
    " + ' </tool_call> ' }}{% endfor %}{{ '<|end|> ' }}"
    "{% else %}{{ '<|' + message['role'] + '|> ' }}"
    "{% if message['content'] is string %}{{ message['content'] }}"
    "{% else %}{% for block in message['content'] %}"
    "{% if block['type'] == 'text' %}{{ block['text'] }}"
    "{% else %}{{ '<|vision_start|><|image_pad|><|vision_end|>' }}{% endif %}"
    "{% endfor %}{% endif %}{{ ' <|end|> ' }}{% endif %}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|assistant|> ' }}{% endif %}"
)


def build_vlm_tokenizer(words: Iterable[str] = (), *, tool_calls: bool = False) -> Any:
    """tiny.build_tokenizer's tokenizer with the vision tokens and :data:`VLM_CHAT_TEMPLATE`
    (``tool_calls``: :data:`VLM_TOOL_CHAT_TEMPLATE` and the ``<tool_call>`` tokens)."""
    tokenizer = build_tokenizer(words)
    tokenizer.add_tokens(VISION_TOKENS, special_tokens=True)
    tokenizer.chat_template = VLM_TOOL_CHAT_TEMPLATE if tool_calls else VLM_CHAT_TEMPLATE
    if tool_calls:
        tokenizer.add_tokens(TOOL_CALL_TOKENS)
    return tokenizer


def build_image_processor(min_pixels: int = 28 * 28 * 4, max_pixels: int = 28 * 28 * 16) -> Any:
    """Qwen2-VL's Pillow image processor; the pixel bounds keep images to a few dozen tokens
    (a 256x256 diagram -> 112x112 -> 16 image tokens)."""
    from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import Qwen2VLImageProcessorPil

    return Qwen2VLImageProcessorPil(min_pixels=min_pixels, max_pixels=max_pixels)


def load_image_processor(path: str | Path) -> Any:
    from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import Qwen2VLImageProcessorPil

    return Qwen2VLImageProcessorPil.from_pretrained(str(path))


def init_tiny_vlm(
    path: str | Path,
    vocab_words: Iterable[str] = (),
    seed: int = 0,
    *,
    hidden_size: int = 128,
    num_layers: int = 2,
    num_heads: int = 2,
    intermediate_size: int = 256,
    max_positions: int = 2048,
    vision_depth: int = 1,
    vision_dim: int = 64,
    tool_calls: bool = False,
) -> Path:
    """Write a random-init Qwen2-VL (2 text layers, 1 vision block) with its tokenizer and image
    processor to ``path`` and return it. Deterministic for a seed. ``tool_calls``: the tokenizer
    renders native tool calls (:data:`VLM_TOOL_CHAT_TEMPLATE`)."""
    import torch
    from transformers import GenerationConfig, Qwen2VLConfig, Qwen2VLForConditionalGeneration

    head_dim = hidden_size // num_heads
    if hidden_size % num_heads or head_dim % 8:
        raise InputError(f"init_tiny_vlm: hidden_size/num_heads must be a multiple of 8, got {head_dim}")
    out = Path(path)
    out.mkdir(parents=True, exist_ok=True)
    tokenizer = build_vlm_tokenizer(vocab_words, tool_calls=tool_calls)
    start, pad, end = tokenizer.convert_tokens_to_ids(VISION_TOKENS)
    # M-RoPE splits each head's rotary half into (time, height, width) sections.
    half = head_dim // 2
    section = [half - 2 * (3 * half // 8), 3 * half // 8, 3 * half // 8]
    config = Qwen2VLConfig(
        text_config={
            "vocab_size": len(tokenizer),
            "hidden_size": hidden_size,
            "intermediate_size": intermediate_size,
            "num_hidden_layers": num_layers,
            "num_attention_heads": num_heads,
            "num_key_value_heads": num_heads,
            "max_position_embeddings": max_positions,
            "rope_parameters": {"rope_type": "default", "rope_theta": 10000.0, "mrope_section": section},
            "pad_token_id": tokenizer.pad_token_id,
            "eos_token_id": tokenizer.eos_token_id,
            "bos_token_id": None,
        },
        vision_config={
            "depth": vision_depth,
            "embed_dim": vision_dim,
            "hidden_size": hidden_size,
            "num_heads": 2,
            "mlp_ratio": 2,
            "patch_size": 14,
            "spatial_merge_size": 2,
            "temporal_patch_size": 2,
        },
        image_token_id=pad,
        video_token_id=pad,
        vision_start_token_id=start,
        vision_end_token_id=end,
        tie_word_embeddings=True,
    )
    torch.manual_seed(seed)
    model = Qwen2VLForConditionalGeneration(config)
    # A trained VLM never samples its vision placeholders (they come only from the processor);
    # a random one would, and a sampled <|image_pad|> then miscounts the images at training. So
    # dimension 0 of every (tied) embedding carries +4 and the vision tokens' -4: the residual
    # stream's dimension 0 stays positive at text positions, where the vision tokens' logits
    # then sit ~90 below every other token's, while the rest of the model stays random.
    with torch.no_grad():
        embeddings = cast(torch.Tensor, model.get_input_embeddings().weight)
        embeddings[:, 0] = 4.0
        embeddings[[start, pad, end], 0] = -4.0
    model.generation_config = GenerationConfig(
        eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id
    )
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)
    build_image_processor().save_pretrained(out)
    return out


__all__ = [
    "IMAGE_PAD",
    "VISION_END",
    "VISION_START",
    "VISION_TOKENS",
    "VLM_CHAT_TEMPLATE",
    "VLM_TOOL_CHAT_TEMPLATE",
    "build_image_processor",
    "build_vlm_tokenizer",
    "init_tiny_vlm",
    "load_image_processor",
]
