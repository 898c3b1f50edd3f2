"""DeepCoder-style code generation: the model writes a Python program; the evaluator runs it on
every hidden test in the rollout's sandbox once the flow is done (CPU, memory and process limits,
a wall clock per test, no network). Reward 1 only when every test's output matches. The flow sees
only the agent's view of the task: the tests and the reference solution are grader-only."""

from __future__ import annotations

import re
from typing import Any

from rllm.sdk import rollout, sampling_kwargs
from rllm.sdk.clients import async_openai
from rllm.sdk.cookbook import Cookbook, train_defaults
from rllm.sdk.evaluator import evaluator
from rllm.sdk.sandbox import Sandbox, SandboxLimits, SandboxSpec, current_sandbox, needs_sandbox
from rllm.types import AgentConfig, EvalOutput, Signal, Task
from rllm_cookbook_deepcoder.data import generate, load_tasks, stdin_tests

SYSTEM = (
    "Solve the programming problem in Python 3. The program reads standard input and writes "
    "standard output. Reply with the complete program in one ```python code block."
)
TEST_TIMEOUT_S = 6.0
SANDBOX = SandboxSpec(
    network=False,
    limits=SandboxLimits(
        cpu_s=5, memory_mb=512, max_procs=16, output_bytes=256 * 1024, exec_timeout_s=TEST_TIMEOUT_S
    ),
)
_CODE = re.compile(r"```(?:python3?|py)?[ \t]*\n(.*?)```", re.DOTALL)


def extract_code(text: str) -> str | None:
    """The last fenced code block of a reply (models often sketch first, answer last)."""
    blocks = _CODE.findall(text)
    return blocks[-1] if blocks else None


def same_output(got: str, expected: str) -> bool:
    """Equal up to trailing whitespace on each line and trailing blank lines."""

    def norm(s: str) -> list[str]:
        lines = [line.rstrip() for line in s.strip("\n").split("\n")]
        return lines

    return norm(got) == norm(expected)


async def run_hidden_tests(sandbox: Sandbox, code: str, tests: list[dict[str, str]]) -> dict[str, Any]:
    """Run ``code`` on each test in order, stopping at the first failure (the reward needs all).

    Every input is written before the program first runs, so nothing it leaves behind (a link,
    a FIFO, a read-only folder) can stand where the harness writes; what it does to later
    inputs only fails its own later tests."""
    await sandbox.write_file("solution.py", code)
    for i, test in enumerate(tests):
        await sandbox.write_file(f".hidden/{i}.in", test["input"])
    passed, failure = 0, None
    for i, test in enumerate(tests):
        result = await sandbox.exec(f"python3 solution.py < .hidden/{i}.in", timeout=TEST_TIMEOUT_S)
        if result.timed_out:
            failure = f"test {i}: time limit exceeded"
        elif result.exit_code != 0:
            failure = f"test {i}: exit {result.exit_code}: {result.stderr.strip()[-300:]}"
        elif not same_output(result.stdout, test["output"]):
            failure = f"test {i}: wrong answer"
        if failure:
            break
        passed += 1
    return {"passed": passed, "total": len(tests), "all_passed": failure is None, "failure": failure}


@needs_sandbox(SANDBOX)
@rollout
async def deepcoder_flow(task: Task, config: AgentConfig) -> dict[str, Any]:
    messages = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": str(task.instruction)}]
    async with async_openai(config) as client:
        reply = await client.chat.completions.create(
            model=config.model, messages=messages, **{"max_tokens": 2048, **sampling_kwargs(config)}
        )
    return {"code": extract_code(reply.choices[0].message.content or "")}


@evaluator
async def deepcoder_evaluator(task: Task, episode: Any) -> EvalOutput:
    """The program on the task's hidden tests, in the rollout's sandbox (kept open for the
    evaluator): reward 1 only when all pass."""
    tests = task.metadata["tests"]
    code = episode.artifacts.get("code")
    if code is None:
        outcome: dict[str, Any] = {
            "passed": 0,
            "total": len(tests),
            "all_passed": False,
            "failure": "no code block",
        }
    else:
        outcome = await run_hidden_tests(current_sandbox(), code, tests)
    solved = bool(outcome["all_passed"])
    return EvalOutput(
        reward=1.0 if solved else 0.0,
        is_correct=solved,
        signals=[Signal(name="tests_passed_fraction", value=outcome["passed"] / max(1, outcome["total"]))],
        metadata={"failure": outcome["failure"], "passed": outcome["passed"], "total": outcome["total"]},
    )


TRAIN_DEFAULTS = train_defaults(max_tokens=2048, rollout={"sandbox_warm": 16})

cookbook = Cookbook(
    name="deepcoder",
    flow=deepcoder_flow,
    evaluator=deepcoder_evaluator,
    load_tasks=load_tasks,
    description="Code generation; reward 1 only when every hidden test passes in the sandbox.",
    train_defaults=TRAIN_DEFAULTS,
)

__all__ = [
    "SANDBOX",
    "cookbook",
    "deepcoder_evaluator",
    "deepcoder_flow",
    "extract_code",
    "generate",
    "load_tasks",
    "run_hidden_tests",
    "same_output",
    "stdin_tests",
]
