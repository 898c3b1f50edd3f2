"""Third-party noise off the terminal by default: progress bars, banners and chatty loggers.

What a command prints should be rLLM's own lines and real warnings. Hugging Face progress bars
("Loading weights", "Generating train split"), transformers' advisories, LiteLLM's banners and
the event-loop-lag paragraph (which is in each step's metrics as ``time/loop_lag_max_s``)
drown them. ``rllm --debug`` (and ``-v``) keeps everything. The environment variables reach
the processes a command spawns (rollout workers, samplers) too; a variable the user set wins.
"""

from __future__ import annotations

import logging
import os

# Loggers whose warnings are not the user's business at the terminal (kept under --debug).
QUIET_LOGGERS: tuple[str, ...] = (
    "LiteLLM",
    "LiteLLM Proxy",
    "LiteLLM Router",
    "litellm",
    "httpx",
    "datasets",
    "transformers",
    "huggingface_hub",
    "filelock",
    "math_verify",
    "rllm.engine.rollout.loop_lag",
)

QUIET_ENV: dict[str, str] = {
    "HF_HUB_DISABLE_PROGRESS_BARS": "1",
    "HF_DATASETS_DISABLE_PROGRESS_BARS": "1",
    "TRANSFORMERS_VERBOSITY": "error",
    "TRANSFORMERS_NO_ADVISORY_WARNINGS": "1",
    "LITELLM_LOG": "ERROR",
    "TOKENIZERS_PARALLELISM": "false",
    # The rollout workers (rllm.engine.rollout.worker_pool) quiet these too: the lag paragraph is theirs.
    "RLLM_QUIET_LOGGERS": ",".join(QUIET_LOGGERS),
}


def quiet_third_party() -> None:
    """Turn the noise off for this process and the ones it starts."""
    for name, value in QUIET_ENV.items():
        os.environ.setdefault(name, value)
    for name in QUIET_LOGGERS:
        logging.getLogger(name).setLevel(logging.ERROR)
