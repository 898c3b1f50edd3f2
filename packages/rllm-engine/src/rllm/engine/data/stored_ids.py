"""Stored token ids and the tokenizer that made them: an SFT set of ids trains only a model that
tokenizes the same way.

``rllm dataset from-eval`` keeps the sampler's own ids, which mean something only under the
tokenizer of the model that produced them; each record names that tokenizer (its fingerprint,
:func:`rllm.engine.training.model_check.tokenizer_fingerprint`, and the model it came from).
Trained with another tokenizer the same ids decode to other words, and nothing fails: so a set
made with another tokenizer, or one that does not say (written before records named theirs), is
refused before anything is built. ``retokenize`` (``rllm sft --retokenize``) tokenizes those
conversations' messages with the run's own tokenizer instead, and says so.
"""

from __future__ import annotations

from typing import Any

import msgspec

from rllm.engine.data.chat_data import ChatExample
from rllm.engine.training.model_check import tokenizer_fingerprint
from rllm.types.errors import InputError

RETOKENIZE = "pass --retokenize (retokenize=true) to tokenize its messages with this run's tokenizer instead"


def stored_by(examples: list[ChatExample]) -> ChatExample | None:
    """The first conversation that carries stored ids (None: the set is plain chat)."""
    return next((e for e in examples if e.input_ids is not None), None)


def made_by(example: ChatExample) -> str:
    if example.tokenizer is None:
        return "an unrecorded tokenizer"
    return f"the tokenizer of {example.tokenizer_source or 'an unnamed model'} ({example.tokenizer})"


def check_stored_ids(
    examples: list[ChatExample], tokenizer: Any, source: str, *, retokenize: bool
) -> tuple[list[ChatExample], list[str]]:
    """``examples`` as they may be trained with ``tokenizer``, and the warnings to show: an
    InputError for ids of another tokenizer (or an unknown one), unless ``retokenize``, which
    drops those ids so that the messages are tokenized again."""
    if stored_by(examples) is None:
        return examples, []
    ours = tokenizer_fingerprint(tokenizer)
    wrong = [e for e in examples if e.input_ids is not None and e.tokenizer != ours]
    if not wrong:
        return examples, []
    first = wrong[0]
    if not retokenize:
        if first.tokenizer is None:
            raise InputError(
                f"{source}: its token ids do not say which tokenizer made them (a set from an older "
                f"rllm): make it again with `rllm dataset from-eval`, or {RETOKENIZE}"
            )
        raise InputError(
            f"{source}: its token ids were made by {made_by(first)}; this run's model tokenizes "
            f"differently ({ours}), so they would train other words: train that model "
            f"(--model {first.tokenizer_source or 'MODEL'}), or {RETOKENIZE}"
        )
    replaced = {id(e) for e in wrong}
    warning = (
        f"{source}: {len(wrong)} conversation(s) hold ids made by {made_by(first)}: tokenizing their "
        "messages with this run's tokenizer instead (--retokenize)"
    )
    out = [
        msgspec.structs.replace(e, input_ids=None, loss_mask=None, tokenizer=None) if id(e) in replaced else e
        for e in examples
    ]
    return out, [warning]


__all__ = ["RETOKENIZE", "check_stored_ids", "made_by", "stored_by"]
