"""The trace viewer in a real headless Chromium (Debian's chromium + chromedriver, via selenium),
over a run directory made by a real short training run (say-single, local backend).

Run with `nox -s browser` (CI does); skipped where chromium or chromedriver is missing.
"""

from __future__ import annotations

import asyncio
import os
import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest

from rllm.cli.viewer.data import RunView
from rllm.cli.viewer.server import ViewerServer
from rllm.engine.training.metrics_log import read_episode_sample, sample_path

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
CHROMEDRIVER = shutil.which("chromedriver")

pytestmark = [
    pytest.mark.browser,
    pytest.mark.skipif(not (CHROMIUM and CHROMEDRIVER), reason="needs chromium and chromedriver (apt)"),
]

WAIT_S = 60  # an upper bound for a cold, busy machine; every wait returns as soon as the page is there


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from rllm.engine.training.launch import build_trainer

    out = tmp_path_factory.mktemp("run")
    trainer = build_trainer(
        "say-single",
        out_dir=str(out),
        overrides=[
            "progress=false",
            "plot=false",
            "tensorboard=false",
            "total_steps=2",
            "tasks_per_step=2",
            "group_size=2",
            "val_every=0",
            "rollout.workers=1",
            # A random tiny model scores 0 everywhere; keep the groups so the sample shows trained tokens.
            "algorithm.filter_zero_variance=false",
        ],
    )
    asyncio.run(trainer.fit())
    return out


@pytest.fixture
def browser() -> Iterator[object]:
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for flag in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage"):
        options.add_argument(flag)
    options.add_argument("--window-size=1280,900")
    driver = webdriver.Chrome(service=Service(CHROMEDRIVER), options=options)
    try:
        yield driver
    finally:
        driver.quit()


def test_open_an_episode_and_read_its_tokens(run_dir: Path, browser: object, tmp_path: Path) -> None:
    from PIL import Image
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support import expected_conditions as ec
    from selenium.webdriver.support.ui import WebDriverWait

    driver = browser
    wait = WebDriverWait(driver, WAIT_S)
    view = RunView(run_dir)
    assert view.tokens.path is not None  # the tiny model's tokenizer.json gives token texts
    sample = read_episode_sample(sample_path(run_dir, 2))
    with ViewerServer(view) as server:
        driver.get(server.url)
        # The latest step is shown first, its first episode opened.
        wait.until(ec.text_to_be_present_in_element((By.ID, "step-select"), "step 2"))
        rows = wait.until(ec.presence_of_all_elements_located((By.CSS_SELECTOR, ".episode-row")))
        assert len(rows) == len(sample.episodes)
        rows[1].click()
        wait.until(ec.text_to_be_present_in_element((By.CSS_SELECTOR, "#episode h2"), "rollout 1"))
        wait.until(ec.presence_of_element_located((By.CSS_SELECTOR, ".tokens .tok")))

        expected = sample.episodes[1].trajectories[0].steps[0]
        spans = driver.find_elements(By.CSS_SELECTOR, ".tokens[data-step='0'] .tok")
        assert [int(s.get_attribute("data-id")) for s in spans] == list(expected.completion_ids)
        assert [s.text for s in spans] == [view.tokens(i).strip() for i in expected.completion_ids]
        first = spans[0].get_attribute("title")
        assert f"logprob {expected.completion_logprobs[0]:.3f}" in first and "loss mask 1" in first
        assert driver.find_element(By.CSS_SELECTOR, ".msg.user").text.endswith(
            sample.episodes[1].trajectories[0].steps[0].input[0].content
        )

        # Keys: k goes back to the first episode.
        driver.find_element(By.TAG_NAME, "body").send_keys("k")
        wait.until(ec.text_to_be_present_in_element((By.CSS_SELECTOR, "#episode h2"), "rollout 0"))

        # Colour toggle: by loss mask every trained token gets the same colour.
        from selenium.webdriver.support.ui import Select

        Select(driver.find_element(By.ID, "color-by")).select_by_value("mask")
        wait.until(ec.text_to_be_present_in_element_value((By.ID, "color-by"), "mask"))

        # Curves: the reward curve has one point per logged step (one history).
        driver.find_element(By.ID, "tab-curves").click()
        # The panel must show; the line itself may be flat (equal rewards), a zero-height box
        # that Selenium never calls visible, so it is found by presence.
        wait.until(ec.visibility_of_element_located((By.ID, "curves")))
        line = wait.until(
            ec.presence_of_element_located((By.CSS_SELECTOR, "#curves polyline[data-metric='reward/mean']"))
        )
        assert len(line.get_attribute("points").split()) == 2
        driver.find_element(By.ID, "tab-episode").click()

        screenshot = Path(os.environ.get("RLLM_VIEWER_SCREENSHOT", tmp_path / "viewer.png"))
        assert driver.save_screenshot(str(screenshot))

    image = Image.open(screenshot).convert("RGB")
    assert image.size[0] >= 1000 and image.size[1] >= 600
    colours = image.getcolors(maxcolors=1 << 20) or []
    # A blank page has one or two colours; the viewer has text, badges, token highlights.
    assert len(colours) > 50, len(colours)
    dominant = max(count for count, _ in colours)
    assert dominant < 0.95 * image.size[0] * image.size[1]


def test_an_image_stored_once_per_episode_is_shown_in_every_step(browser: object, tmp_path: Path) -> None:
    """Steps hold rllm-image:sha256: references; the page draws the episode's image for each."""
    import io

    from PIL import Image
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support import expected_conditions as ec
    from selenium.webdriver.support.ui import WebDriverWait

    from rllm.engine.training.metrics_log import MetricsLogger, write_episode_sample
    from rllm.types import Episode, Message, Step, Trajectory, convert
    from rllm.types.images import data_uri, intern_images

    buf = io.BytesIO()
    Image.new("RGB", (24, 16), (0, 90, 200)).save(buf, format="PNG")
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
    logger = MetricsLogger(tmp_path, tensorboard=False)
    logger.log(1, {"reward/mean": 0.0})
    logger.close()
    write_episode_sample(tmp_path, 1, [Episode(task_id="geo", trajectories=[Trajectory(steps=steps)])], [], 1)
    driver = browser
    with ViewerServer(RunView(tmp_path)) as server:
        driver.get(server.url)
        wait = WebDriverWait(driver, WAIT_S)
        wait.until(ec.presence_of_element_located((By.CSS_SELECTOR, ".msg.user img")))
        wait.until(
            lambda d: all(
                i.get_attribute("naturalWidth") == "24" for i in d.find_elements(By.TAG_NAME, "img")
            )
        )
        shown = driver.find_elements(By.CSS_SELECTOR, ".msg.user img")
    assert len(shown) == 2 and all(i.get_attribute("src") == url for i in shown)


def _fixes_run(tmp_path: Path) -> Path:
    """A run whose step holds what the viewer used to show badly: a very long token strip, a
    filtered episode, a turn-credited trajectory, a no-learning warning and a 12-step curve."""
    from rllm.engine.training.metrics_log import MetricsLogger, write_episode_sample
    from rllm.types import Episode, Message, Step, Trajectory

    logger = MetricsLogger(tmp_path, tensorboard=False)
    for step in range(1, 13):
        row: dict[str, object] = {"reward/mean": step / 12, "train/sequences": 4}
        if step == 3:
            row["warning/no_trainable_sequences"] = "no trainable sequence in 3 steps in a row"
        logger.log(step, row)
    logger.close()
    long_step = Step(
        input=[Message(role="user", content="say: " + "x" * 3000)],
        prompt_ids=[1],
        completion_ids=list(range(100_000, 100_600)),  # 600 tokens shown as "#100000"...: no spaces
        completion_logprobs=[-0.5] * 600,
    )
    turns = [
        Step(prompt_ids=[1], completion_ids=[5], completion_logprobs=[-0.1], reward=1.0),
        Step(prompt_ids=[1], completion_ids=[6], completion_logprobs=[-0.1]),
    ]
    trained_episode = Episode(
        task_id="turns", trajectories=[Trajectory(steps=turns, reward=0.0)], metrics={"reward": 0.5}
    )
    filtered = Episode(
        task_id="long", trajectories=[Trajectory(steps=[long_step], reward=0.0)], metrics={"reward": 0.0}
    )
    trained = [t.id for t in trained_episode.trajectories]
    write_episode_sample(tmp_path, 12, [trained_episode, filtered], trained, groups=2)
    return tmp_path


def test_long_strips_wrap_filtered_tokens_read_rewards_agree_curves_have_ticks(
    browser: object, tmp_path: Path
) -> None:
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support import expected_conditions as ec
    from selenium.webdriver.support.ui import WebDriverWait

    driver = browser
    wait = WebDriverWait(driver, WAIT_S)
    with ViewerServer(RunView(_fixes_run(tmp_path))) as server:
        driver.get(server.url)
        rows = wait.until(ec.presence_of_all_elements_located((By.CSS_SELECTOR, ".episode-row")))
        # The warning is on the page.
        banner = wait.until(ec.visibility_of_element_located((By.CSS_SELECTOR, "#warnings .warning")))
        assert "no trainable sequence" in banner.text

        # Turn credit: the trajectory line shows each step's reward, which the episode's mean agrees with.
        wait.until(ec.text_to_be_present_in_element((By.CSS_SELECTOR, "#episode h2"), "turns"))
        assert "episode reward 0.500" in driver.find_element(By.ID, "episode-summary").text
        assert "step rewards 1.000, 0.000" in driver.find_element(By.CSS_SELECTOR, "h3.trajectory").text

        # The long, filtered episode: its strip wraps inside the window, its tokens stay readable.
        rows[1].click()
        wait.until(ec.text_to_be_present_in_element((By.CSS_SELECTOR, "#episode h2"), "long"))
        wait.until(lambda d: len(d.find_elements(By.CSS_SELECTOR, ".tokens .tok")) == 600)
        overflow = driver.execute_script(
            "const m = document.querySelector('main'), t = document.querySelector('.tokens');"
            "return [document.documentElement.scrollWidth - window.innerWidth,"
            " m.scrollWidth - m.clientWidth, t.scrollWidth - t.clientWidth];"
        )
        assert overflow == [0, 0, 0], overflow
        token = driver.find_element(By.CSS_SELECTOR, ".tok.masked")
        assert token.value_of_css_property("opacity") == "1"
        assert "line-through" not in token.value_of_css_property("text-decoration-line")
        assert "filtered" in driver.find_element(By.CSS_SELECTOR, "h3.trajectory").text

        # Curves: the panel's full width, ticks and labels on both axes.
        driver.find_element(By.ID, "tab-curves").click()
        svg = wait.until(ec.visibility_of_element_located((By.CSS_SELECTOR, "#curves svg")))
        panel = driver.find_element(By.ID, "curves")
        assert svg.size["width"] >= 0.9 * panel.size["width"]
        yticks = [t.text for t in driver.find_elements(By.CSS_SELECTOR, "#curves text.ytick")]
        xticks = [t.text for t in driver.find_elements(By.CSS_SELECTOR, "#curves text.xtick")]
        assert len(yticks) >= 4 and len(xticks) >= 4, (yticks, xticks)
        assert all(float(y) == float(y) for y in yticks) and {"2", "10"} <= set(xticks)


def test_an_eval_folder_is_viewable(browser: object, tmp_path: Path) -> None:
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support import expected_conditions as ec
    from selenium.webdriver.support.ui import WebDriverWait

    from rllm.types import Episode, Step, Trajectory, to_json

    step = Step(prompt_ids=[1], completion_ids=[7, 8], completion_logprobs=[-0.2, -1.5])
    episodes = [
        Episode(task_id=f"t{i}", trajectories=[Trajectory(steps=[step])], metrics={"reward": float(i % 2)})
        for i in range(3)
    ]
    (tmp_path / "episodes.jsonl").write_bytes(b"".join(to_json(e) + b"\n" for e in episodes))
    driver = browser
    wait = WebDriverWait(driver, WAIT_S)
    with ViewerServer(RunView(tmp_path)) as server:
        driver.get(server.url)
        wait.until(ec.text_to_be_present_in_element((By.ID, "step-select"), "evaluation"))
        rows = wait.until(ec.presence_of_all_elements_located((By.CSS_SELECTOR, ".episode-row")))
        assert len(rows) == 3 and "filtered" not in rows[0].text
        wait.until(ec.presence_of_element_located((By.CSS_SELECTOR, ".tokens .tok")))
        assert not driver.find_elements(By.CSS_SELECTOR, ".tok.masked")


def _issue49_run(tmp_path: Path) -> Path:
    """A two-policy run whose last step holds a partial reward, a failure with a long unbroken
    error, and a pass; its reward curve tops out between round values (12/13)."""
    from rllm.engine.training.metrics_log import MetricsLogger, write_episode_sample
    from rllm.types import Episode, ErrorInfo, Step, TerminationReason, Trajectory

    logger = MetricsLogger(tmp_path, tensorboard=False)
    for step in range(1, 13):
        logger.log(step, {"reward/mean": step / 13})
    logger.close()

    def episode(task: str, reward: float, policy: str, **fields: object) -> Episode:
        step = Step(prompt_ids=[1], completion_ids=[5, 6, 7], completion_logprobs=[-0.1] * 3)
        step.metadata["policy"] = policy
        trajectory = Trajectory(steps=[step], reward=reward, role=policy)
        return Episode(task_id=task, trajectories=[trajectory], metrics={"reward": reward}, **fields)  # type: ignore[arg-type]

    error = ErrorInfo(type="RuntimeError", message="/very/long/path/" + "x" * 3000)
    episodes = [
        episode("partial", 0.5, "solver", is_correct=False),
        episode(
            "crashed",
            0.0,
            "judge",
            is_correct=False,
            error=error,
            termination_reason=TerminationReason.AGENT_ERROR,
        ),
        episode("passed", 1.0, "solver", is_correct=True),
    ]
    write_episode_sample(tmp_path, 12, episodes, [t.id for e in episodes for t in e.trajectories], groups=3)
    return tmp_path


def _sft_and_eval_folders(tmp_path: Path) -> tuple[Path, Path]:
    import msgspec

    from rllm.engine.evaluation import summarize, task_result
    from rllm.engine.training.metrics_log import MetricsLogger
    from rllm.engine.training.run_folder import RunFolder
    from rllm.types import Episode, Step, Trajectory, to_json

    sft = tmp_path / "sft"
    RunFolder(sft, "sft", {"dataset": "chats.jsonl"}).begin()
    logger = MetricsLogger(sft, tensorboard=False)
    for step in (1, 2, 3):
        logger.log(step, {"train/loss": 2.0 / step})
    logger.close()
    evaluation = tmp_path / "eval"
    evaluation.mkdir()
    step = Step(prompt_ids=[1], completion_ids=[7, 8], completion_logprobs=[-0.2, -1.5])
    episodes = [
        Episode(
            task_id="t", trajectories=[Trajectory(steps=[step])], metrics={"reward": 1.0}, is_correct=True
        )
    ]
    (evaluation / "episodes.jsonl").write_bytes(b"".join(to_json(e) + b"\n" for e in episodes))
    summary = summarize([task_result("t", episodes)], attempts=1)
    (evaluation / "summary.json").write_bytes(msgspec.json.encode(summary))
    return sft, evaluation


def test_partial_rewards_errors_token_bounds_axis_top_policies_sft_loss_eval_summary(
    browser: object, tmp_path: Path
) -> None:
    """Issue 49's viewer items and issue 53's policy colours, on one page load per folder."""
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support import expected_conditions as ec
    from selenium.webdriver.support.ui import WebDriverWait

    driver = browser
    wait = WebDriverWait(driver, WAIT_S)
    with ViewerServer(RunView(_issue49_run(tmp_path / "run"))) as server:
        driver.get(server.url)
        rows = wait.until(lambda d: d.find_elements(By.CSS_SELECTOR, ".episode-row") or None)
        assert len(rows) == 3
        badges = [r.find_element(By.CSS_SELECTOR, ".badge.reward") for r in rows]
        assert [b.get_attribute("class").split()[-1] for b in badges] == ["partial", "bad", "ok"]
        colours = {b.value_of_css_property("background-color") for b in badges}
        assert len(colours) == 3, colours  # a partial reward is painted neither as a pass nor a failure

        # Token boundaries: neighbouring tokens of the same colour still differ in their marking.
        wait.until(ec.presence_of_element_located((By.CSS_SELECTOR, ".tokens .tok")))
        marks = [t.value_of_css_property("box-shadow") for t in driver.find_elements(By.CSS_SELECTOR, ".tok")]
        assert len(marks) == 3 and marks[0] != marks[1] and marks[0] == marks[2], marks

        # Several policies: a legend names each, and each step is marked in its policy's colour.
        legend = driver.find_element(By.ID, "policy-legend")
        assert legend.is_displayed()
        assert [p.text for p in legend.find_elements(By.CSS_SELECTOR, ".policy-name")] == ["judge", "solver"]
        solver_colour = driver.find_element(By.CSS_SELECTOR, ".step[data-policy]").value_of_css_property(
            "border-left-color"
        )
        assert "policy solver" in driver.find_element(By.CSS_SELECTOR, ".step .legend").text

        # A long unbroken error wraps inside the window.
        rows[1].click()
        wait.until(ec.text_to_be_present_in_element((By.CSS_SELECTOR, "#episode h2"), "crashed"))
        error = driver.find_element(By.CSS_SELECTOR, "#episode pre.error")
        overflow = driver.execute_script(
            "const m = document.querySelector('main'), e = arguments[0];"
            "return [document.documentElement.scrollWidth - window.innerWidth,"
            " m.scrollWidth - m.clientWidth, e.scrollWidth - e.clientWidth];",
            error,
        )
        assert overflow == [0, 0, 0], overflow
        judge = driver.find_element(By.CSS_SELECTOR, ".step[data-policy='judge']")
        assert judge.value_of_css_property("border-left-color") != solver_colour

        # The curve's y axis ends on a label at or above the curve's top (12/13).
        driver.find_element(By.ID, "tab-curves").click()
        wait.until(ec.visibility_of_element_located((By.CSS_SELECTOR, "#curves svg")))
        ticks = driver.find_elements(By.CSS_SELECTOR, "#curves text.ytick")
        top = min(ticks, key=lambda t: float(t.get_attribute("y")))
        assert float(top.text) >= 12 / 13, [t.text for t in ticks]

    sft, evaluation = _sft_and_eval_folders(tmp_path)
    with ViewerServer(RunView(sft)) as server:
        driver.get(server.url)  # an SFT run opens on its loss
        wait.until(
            ec.visibility_of_element_located((By.CSS_SELECTOR, "#curves polyline[data-metric='train/loss']"))
        )
        assert "SFT run" in driver.find_element(By.ID, "episode-empty").get_attribute("textContent")
    with ViewerServer(RunView(evaluation)) as server:
        driver.get(server.url)
        wait.until(ec.presence_of_element_located((By.CSS_SELECTOR, ".tokens .tok")))
        assert "--tokenizer" in driver.find_element(By.ID, "token-hint").text  # why tokens show as #id
        driver.find_element(By.ID, "tab-curves").click()
        summary = wait.until(ec.visibility_of_element_located((By.ID, "eval-summary")))
        assert "has no curve" in summary.text and "\naccuracy 1\n" in summary.text
