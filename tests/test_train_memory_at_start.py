"""The local trainer's memory check runs when the run starts, before the first rollout (issue #48):
a run whose training step cannot fit is refused with one line naming the estimate, the memory
available and the knobs, having sampled nothing; a run that fits plans its memory just as early.
"""

from __future__ import annotations

import asyncio
import inspect
import logging
import re
from pathlib import Path
from typing import Any

import pytest
from rllm_cookbook_say import load_tasks, say_evaluator, say_flow

from rllm.engine.training.launch import build_trainer
from rllm.sdk import rollout
from rllm.sdk.cookbook import Cookbook
from rllm.types import AgentConfig, Task
from rllm.types.errors import InputError

pytestmark = pytest.mark.slow

RUN = [
    "total_steps=1",
    "tasks_per_step=4",
    "group_size=2",
    "rollout.workers=1",  # flows in this process: the count below sees them
    "rollout.sampling.max_tokens=2",
    "val_every=0",
    "ckpt_every=0",
    "progress=false",
    "plot=false",
    "tensorboard=false",
]


STARTED: list[str] = []  # the tasks whose rollout started, in this process (rollout.workers=1)


@rollout
async def counted(task: Task, config: AgentConfig) -> Any:
    STARTED.append(task.id)
    result = say_flow(task, config)
    assert inspect.isawaitable(result)
    return await result


def counting_cookbook() -> Cookbook:
    STARTED.clear()
    return Cookbook(name="memory-at-start", flow=counted, evaluator=say_evaluator, load_tasks=load_tasks)


def test_a_step_that_cannot_fit_is_refused_before_the_first_rollout(tmp_path: Path) -> None:
    started = STARTED
    trainer = build_trainer(
        "memory-at-start",
        cookbook=counting_cookbook(),
        overrides=[*RUN, "backend.options.memory_limit_gb=0.01"],
        out_dir=str(tmp_path / "run"),
        resume=False,
    )
    with pytest.raises(InputError) as refused:
        asyncio.run(trainer.fit())
    line = str(refused.value)
    assert "\n" not in line
    assert line.startswith("a training step needs an estimated "), line
    assert re.search(r"but 0\.010? GiB is available", line), line
    assert "memory_limit_gb" in line  # the knobs
    assert started == []  # nothing was sampled
    assert not (tmp_path / "run" / "metrics.jsonl").exists()


def test_a_run_that_fits_plans_its_memory_before_the_first_rollout(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    started = STARTED
    seen_at_plan: list[int] = []
    trainer = build_trainer(
        "memory-at-start",
        cookbook=counting_cookbook(),
        overrides=RUN,
        out_dir=str(tmp_path / "run"),
        resume=False,
    )

    class AtPlan(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            if record.getMessage().startswith("before the first rollout: training memory:"):
                seen_at_plan.append(len(started))

    handler = AtPlan()
    logger = logging.getLogger("rllm.engine.training.trainer")
    logger.addHandler(handler)
    try:
        with caplog.at_level(logging.INFO, logger="rllm.engine.training.trainer"):
            asyncio.run(trainer.fit())
    finally:
        logger.removeHandler(handler)
    assert seen_at_plan == [0]  # planned once, before any rollout started
    assert len(started) >= 8  # and then the run rolled out and trained
    line = next(r.getMessage() for r in caplog.records if r.getMessage().startswith("before the first"))
    assert "micro_batch_tokens=" in line and "gradient_checkpointing=" in line and "GiB available" in line
