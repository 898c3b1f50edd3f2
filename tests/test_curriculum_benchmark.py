"""benchmarks/curriculum_learning.py's own logic: each arm's `rllm train` command, and the
untimed warm-up run that takes the machine's cold start before the first timed arm (a real two
steps of `rllm train say-single` on the tiny student, no timing asserted)."""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))  # the script imports distill_vs_rl beside it
_spec = importlib.util.spec_from_file_location(
    "curriculum_learning", ROOT / "benchmarks" / "curriculum_learning.py"
)
assert _spec is not None and _spec.loader is not None
curriculum = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(curriculum)


def _opts() -> argparse.Namespace:
    return argparse.Namespace(lr=1e-3, max_steps=150, set=["rollout.curriculum.window=8"])


def test_each_arm_is_the_plain_command_plus_its_own_keys(tmp_path: Path) -> None:
    plain = curriculum.arm_args("plain", _opts(), tmp_path / "student", 3)
    assert plain[:4] == ["train", "say-single", "--out", "plain"] and "seed=3" in plain
    for arm, keys in curriculum.ARMS.items():
        args = curriculum.arm_args(arm, _opts(), tmp_path / "student", 3)
        extra = [a for a in args if a not in plain]
        if arm == "plain":
            assert extra == []
        else:  # --set goes to every arm but plain
            assert extra == [arm, *keys, "rollout.curriculum.window=8"]


def test_the_warm_up_runs_two_untimed_steps_in_a_folder_of_its_own(tmp_path: Path) -> None:
    env = {**os.environ, "RLLM_HOME": str(tmp_path / "home")}
    for _ in range(2):  # a second benchmark run in the same workdir replaces the first warm-up
        curriculum.warm_up(_opts(), tmp_path, env)
    rows = [json.loads(line) for line in (tmp_path / "warm-up" / "metrics.jsonl").read_text().splitlines()]
    assert [row["step"] for row in rows if "reward/mean" in row] == [1, 2]
    assert not (tmp_path / "plain").exists()  # no arm's folder is touched
