"""The viewer's JSON API over a run directory written with the engine's own sample writer."""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import pytest

from rllm.cli.viewer.data import RunNotFoundError, RunView
from rllm.cli.viewer.server import ViewerServer
from rllm.engine.training.metrics_log import MetricsLogger, write_episode_sample
from rllm.types import Episode, Message, Step, Trajectory


def _episode(task: str, index: int, reward: float) -> Episode:
    step = Step(
        input=[Message(role="user", content=f"say: {task}")],
        output=Message(role="assistant", content=task),
        prompt_ids=[1, 2, 3],
        completion_ids=[7, 8],
        completion_logprobs=[-0.5, -2.0],
        advantage=[0.25, -0.5],
        metadata={"train_logprobs": [-0.25, -2.0]},
    )
    return Episode(
        task_id=task,
        rollout_index=index,
        trajectories=[Trajectory(steps=[step], reward=reward)],
        is_correct=reward == 1.0,
        metrics={"reward": reward},
    )


@pytest.fixture
def run_dir(tmp_path: Path) -> Path:
    logger = MetricsLogger(tmp_path, tensorboard=False)
    for step in (1, 2):
        logger.log(step, {"reward/mean": step / 4, "batch/task_ids": ["a"]})
        episodes = [_episode("apple", 0, 1.0), _episode("apple", 1, 0.0)]
        trained = [episodes[0].trajectories[0].id]
        write_episode_sample(tmp_path, step, episodes, trained, groups=1)
    logger.close()
    return tmp_path


def get(url: str) -> tuple[int, Any]:
    try:
        with urllib.request.urlopen(url, timeout=30) as response:
            body = response.read()
            kind = response.headers["Content-Type"]
            return response.status, json.loads(body) if "json" in kind else body.decode()
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read())


def test_api_serves_runs_episodes_and_tokens(run_dir: Path) -> None:
    with ViewerServer(RunView(run_dir)) as server:
        assert server.url.startswith("http://127.0.0.1:")
        status, page = get(server.url)
        assert status == 200 and "<title>rllm view</title>" in page
        status, run = get(server.url + "api/run")
        assert status == 200 and run["steps"] == [1, 2]
        assert [r["reward/mean"] for r in run["metrics"]] == [0.25, 0.5]
        assert all("batch/task_ids" not in r for r in run["metrics"])  # numbers only
        status, episodes = get(server.url + "api/steps/2/episodes")
        assert [(e["rollout_index"], e["is_correct"], e["trained"]) for e in episodes] == [
            (0, True, True),
            (1, False, False),
        ]
        status, episode = get(server.url + "api/steps/2/episodes/0")
        step = episode["trajectories"][0]["steps"][0]
        assert step["input"] == [{"role": "user", "content": "say: apple"}]
        assert [t["text"] for t in step["tokens"]] == ["#7", "#8"]  # no tokenizer in this run dir
        assert [t["advantage"] for t in step["tokens"]] == [0.25, -0.5]
        assert [t["mask"] for t in step["tokens"]] == [1, 1]
        assert step["tokens"][0]["mismatch"] == pytest.approx(0.25)
        status, other = get(server.url + "api/steps/2/episodes/1")
        assert [t["mask"] for t in other["trajectories"][0]["steps"][0]["tokens"]] == [0, 0]


@pytest.mark.parametrize(
    ("path", "message"),
    [
        ("api/steps/9/episodes", "no episode sample for step 9"),
        ("api/steps/1/episodes/5", "not index 5"),
        ("api/nothing", "no such page"),
    ],
)
def test_api_errors_are_404_with_a_reason(run_dir: Path, path: str, message: str) -> None:
    with ViewerServer(RunView(run_dir)) as server:
        status, body = get(server.url + path)
    assert status == 404 and message in body["error"]


def test_an_empty_directory_is_refused(tmp_path: Path) -> None:
    with pytest.raises(RunNotFoundError, match=r"no metrics\.jsonl, episode samples or episodes\.jsonl"):
        RunView(tmp_path)


def test_an_episodes_image_is_stored_once_and_shown_from_its_reference(tmp_path: Path) -> None:
    """A diagram in both turns of a two-step trajectory: the sample file holds it once, the API
    sends it once per episode, and the steps' blocks reference it by hash."""
    import base64
    import io

    from PIL import Image

    from rllm.engine.training.metrics_log import read_episode_sample, sample_path
    from rllm.types import convert
    from rllm.types.images import data_uri, image_ref, intern_images

    buf = io.BytesIO()
    Image.new("RGB", (16, 16), (0, 90, 200)).save(buf, format="PNG")
    url = data_uri(buf.getvalue(), "PNG")
    history = [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": url}}]}]
    steps = []
    for turn in range(2):
        messages, images = intern_images(convert(history, list[Message]))
        steps.append(
            Step(
                input=messages,
                images=images,
                prompt_ids=[1, 2],
                completion_ids=[3],
                completion_logprobs=[-1.0],
            )
        )
        history += [{"role": "assistant", "content": f"turn {turn}"}, {"role": "user", "content": "more"}]
    episode = Episode(task_id="geo", trajectories=[Trajectory(steps=steps)])
    write_episode_sample(tmp_path, 1, [episode], [], groups=1)
    raw = sample_path(tmp_path, 1).read_bytes()
    assert raw.count(base64.b64decode(url.split(",", 1)[1])) == 0  # stored as base64 text...
    assert raw.count(url.split(",", 1)[1].encode()) == 1  # ...once for the two steps
    kept = read_episode_sample(sample_path(tmp_path, 1)).episodes[0]
    assert [s.images for s in kept.trajectories[0].steps] == [s.images for s in steps]
    with ViewerServer(RunView(tmp_path)) as server:
        status, shown = get(server.url + "api/steps/1/episodes/0")
    assert status == 200
    (digest,) = shown["images"]
    assert shown["images"][digest] == url
    for step in shown["trajectories"][0]["steps"]:
        assert step["input"][0]["content"][0]["image_url"]["url"] == image_ref(digest)


def test_a_schema1_run_directory_still_shows(tmp_path: Path) -> None:
    """A samples file written before the one-vocabulary rename (rllm 790e6a8: ``response_ids``,
    ``logprobs``, a trajectory's ``name``) shows with the new names."""
    samples = tmp_path / "samples"
    samples.mkdir()
    old = Path(__file__).parent / "data" / "schema1_samples_step_7.msgpack"
    (samples / "step_000007.msgpack").write_bytes(old.read_bytes())
    view = RunView(tmp_path)
    episode = view.episode(7, 0)
    solver, judge = episode["trajectories"]
    assert (solver["role"], judge["role"]) == ("solver", "judge")
    assert solver["trained"] and not judge["trained"]
    tokens = solver["steps"][0]["tokens"]
    assert [t["id"] for t in tokens] == [21, 22]
    assert [t["logprob"] for t in tokens] == [-0.5, -0.25]
    assert view.episodes(7)[0]["completion_tokens"] == 2 + 1 + 2


def test_an_eval_folder_is_shown_as_one_step_with_nothing_filtered(tmp_path: Path) -> None:
    from rllm.types import to_json

    episodes = [_episode("apple", 0, 1.0), _episode("lemon", 0, 0.0)]
    (tmp_path / "episodes.jsonl").write_bytes(b"".join(to_json(e) + b"\n" for e in episodes) + b'{"torn')
    (tmp_path / "results.jsonl").write_text("")
    with ViewerServer(RunView(tmp_path)) as server:
        _, run = get(server.url + "api/run")
        assert run["kind"] == "eval" and run["steps"] == [0] and run["metrics"] == []
        _, listed = get(server.url + "api/steps/0/episodes")
        assert [(e["task_id"], e["reward"], e["trained"]) for e in listed] == [
            ("apple", 1.0, None),
            ("lemon", 0.0, None),
        ]
        _, shown = get(server.url + "api/steps/0/episodes/1")
    tokens = shown["trajectories"][0]["steps"][0]["tokens"]
    assert [t["mask"] for t in tokens] == [1, 1]  # nothing was filtered: nothing struck out
    assert shown["trajectories"][0]["trained"] is None


def test_turn_credited_steps_show_their_own_rewards(tmp_path: Path) -> None:
    """The say evaluator credits each turn: the episode's reward is the mean, the trajectory's
    own reward only the last turn's. The API gives each step's reward so the page agrees."""
    steps = [
        Step(prompt_ids=[1], completion_ids=[2], completion_logprobs=[-0.1], reward=1.0),
        Step(prompt_ids=[1], completion_ids=[3], completion_logprobs=[-0.1]),
    ]
    episode = Episode(
        task_id="t", trajectories=[Trajectory(steps=steps, reward=0.0)], metrics={"reward": 0.5}
    )
    write_episode_sample(tmp_path, 1, [episode], [], groups=1)
    shown = RunView(tmp_path).episode(1, 0)
    assert shown["reward"] == 0.5
    assert shown["trajectories"][0]["step_rewards"] == [1.0, 0.0]


def test_the_no_learning_warning_reaches_the_page(tmp_path: Path) -> None:
    logger = MetricsLogger(tmp_path, tensorboard=False)
    logger.log(1, {"reward/mean": 0.0, "train/sequences": 0})
    logger.log(3, {"reward/mean": 0.0, "warning/no_trainable_sequences": "no trainable sequence in 3 steps"})
    logger.close()
    run = RunView(tmp_path).run()
    assert run["warnings"] == ["no trainable sequence in 3 steps"]


def _byte_tokenizer(folder: Path) -> Path:
    """A model folder whose tokenizer.json reads the mock upstream's ids (bytes) as characters."""
    from tokenizers import Tokenizer
    from tokenizers.models import WordLevel

    folder.mkdir()
    vocab = {chr(i): i for i in range(1, 128)} | {"<unk>": 0}
    Tokenizer(WordLevel(vocab, unk_token="<unk>")).save(str(folder / "tokenizer.json"))
    return folder


@pytest.fixture(scope="module")
def resumed_eval(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """`rllm eval` of one task against a dead endpoint (its attempt retried, then failed), then
    `--resume` against a live one: episodes.jsonl holds the rollout twice, as eval writes it. The
    model is named by a local folder with a tokenizer.json."""
    import socket

    from click.testing import CliRunner

    from rllm.cli.main import cli
    from rllm.testing import MockUpstream, say_back

    root = tmp_path_factory.mktemp("eval")
    model = _byte_tokenizer(root / "model")
    out = root / "out"
    flags = [
        "--out",
        str(out),
        "--model",
        str(model),
        "--max-examples",
        "1",
        "--max-tokens",
        "16",
        "--no-progress",
    ]
    dead = socket.socket()  # bound, never listening: every connection is refused
    dead.bind(("127.0.0.1", 0))
    upstream = MockUpstream(responder=say_back()).start_in_thread()
    try:
        dead_url = f"http://127.0.0.1:{dead.getsockname()[1]}/v1"
        first = CliRunner().invoke(cli, ["eval", "say-single", "--base-url", dead_url, *flags])
        assert first.exit_code == 1, first.stderr  # every rollout failed for infrastructure reasons
        resumed = CliRunner().invoke(
            cli,
            [
                "eval",
                "say-single",
                "--base-url",
                upstream.url,
                *flags,
                "--resume",
                "--allow-changes",
                "base_url",
            ],
        )
        assert resumed.exit_code == 0, resumed.stderr
    finally:
        upstream.stop_in_thread()
        dead.close()
    return out


def test_a_retried_eval_rollout_is_listed_once_with_its_retry_history(resumed_eval: Path) -> None:
    assert len((resumed_eval / "episodes.jsonl").read_text().splitlines()) == 2  # the same rollout twice
    with ViewerServer(RunView(resumed_eval)) as server:
        _, listed = get(server.url + "api/steps/0/episodes")
        assert [(e["rollout_index"], e["termination_reason"], e["reward"]) for e in listed] == [
            (0, "done", 1.0)
        ]
        _, shown = get(server.url + "api/steps/0/episodes/0")
    history = shown["retries"]
    assert listed[0]["retries"] == len(history) == 3  # two retries at once, then the failed run
    assert [h["termination_reason"] for h in history] == ["infra_error"] * 3
    assert "run again by --resume" in history[-1]["when"]
    assert all("Connect call failed" in h["error"] for h in history)


def test_an_eval_folder_shows_its_summary_and_decodes_tokens_with_the_recorded_model(
    resumed_eval: Path,
) -> None:
    view = RunView(resumed_eval)
    run = view.run()
    assert run["kind"] == "eval" and run["metrics"] == []
    assert run["summary"]["accuracy"] == 1.0 and run["summary"]["num_tasks"] == 1  # what Curves shows
    assert run["tokenizer"] == str(resumed_eval.parent / "model" / "tokenizer.json")
    assert run["token_hint"] is None
    step = view.episode(0, 0)["trajectories"][0]["steps"][0]
    assert "".join(t["text"] for t in step["tokens"]) == step["output"]["content"]


def test_without_a_tokenizer_the_page_is_told_why_tokens_have_no_text(tmp_path: Path) -> None:
    from rllm.types import ErrorInfo, TerminationReason, to_json

    failed = Episode(
        task_id="lemon",
        termination_reason=TerminationReason.AGENT_ERROR,
        error=ErrorInfo(type="ValueError", message="the agent crashed before calling the model"),
    )
    lines = [to_json(_episode("apple", 0, 1.0)), to_json(failed)]
    (tmp_path / "episodes.jsonl").write_bytes(b"\n".join(lines) + b"\n")
    view = RunView(tmp_path)
    assert "--tokenizer" in view.run()["token_hint"]
    assert view.episode(0, 0)["text_hint"] is None
    hint = view.episode(0, 1)["text_hint"]
    assert "no model call" in hint and "ValueError: the agent crashed" in hint


def test_an_sft_run_is_a_kind_of_its_own_with_its_loss(tmp_path: Path) -> None:
    """An SFT folder (its record says sft) has metrics and no samples: the page opens on its loss."""
    from rllm.engine.training.run_folder import RunFolder

    RunFolder(tmp_path, "sft", {"dataset": "chats.jsonl"}).begin()
    logger = MetricsLogger(tmp_path, tensorboard=False)
    for step in (1, 2, 3):
        logger.log(step, {"train/loss": 2.0 / step})
    logger.close()
    run = RunView(tmp_path).run()
    assert run["kind"] == "sft" and run["steps"] == []
    assert [r["train/loss"] for r in run["metrics"]] == pytest.approx([2.0, 1.0, 2.0 / 3])


def test_steps_carry_the_policy_that_answered_them(tmp_path: Path) -> None:
    solver, judge = _episode("apple", 0, 1.0), _episode("apple", 1, 0.5)
    solver.trajectories[0].steps[0].metadata["policy"] = "solver"
    judge.trajectories[0].steps[0].metadata["policy"] = "judge"
    write_episode_sample(tmp_path, 1, [solver, judge], [], groups=1)
    view = RunView(tmp_path)
    assert [e["policies"] for e in view.episodes(1)] == [["solver"], ["judge"]]
    assert view.episode(1, 1)["trajectories"][0]["steps"][0]["policy"] == "judge"
