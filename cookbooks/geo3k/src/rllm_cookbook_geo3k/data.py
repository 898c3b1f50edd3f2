"""Geo3K tasks: generated diagrams shipped in the package (offline default) or the hub dataset.

``load_tasks("train" | "test")`` reads the sample (``sample/<split>.jsonl`` + ``sample/images``);
``load_tasks("hub:train" | "hub:test")`` loads Geometry3K from the Hugging Face hub with the
``datasets`` library (``pip install 'rllm-cookbook-geo3k[hub]'``), writing its images as PNG
files under a cache directory. Every task's ``metadata["image"]`` is a path to its diagram.
"""

from __future__ import annotations

import json
import os
import random
from pathlib import Path
from typing import Any

from rllm.sdk.cookbook import sample_rows
from rllm.sdk.hub import hub_rows
from rllm.types import Task
from rllm_cookbook_geo3k.diagrams import draw_problem

SAMPLE_DIR = Path(__file__).parent / "sample"
SAMPLE_SIZES = {"train": 20, "test": 10}
HUB_NAME = "hiyouga/geometry3k"
HUB_SPLITS = {"hub:train": "train", "hub:test": "test"}


def generate(split: str, out_dir: Path | None = None) -> list[dict[str, Any]]:
    """The sample's rows, deterministic per split; with ``out_dir`` the diagrams are written to
    ``out_dir/images`` (the shipped sample is this function's output)."""
    rng = random.Random(f"geo3k-{split}")
    rows = []
    for i in range(SAMPLE_SIZES[split]):
        question, answer, png = draw_problem(rng)
        row_id = f"{split}-{i:03d}"
        image = f"images/{row_id}.png"
        if out_dir is not None:
            (out_dir / "images").mkdir(parents=True, exist_ok=True)
            (out_dir / image).write_bytes(png)
        rows.append({"id": row_id, "question": question, "answer": answer, "image": image})
    return rows


def write_sample(out_dir: Path = SAMPLE_DIR) -> None:
    """Regenerate the shipped sample (``python -m rllm_cookbook_geo3k.data``)."""
    for split in SAMPLE_SIZES:
        rows = generate(split, out_dir)
        (out_dir / f"{split}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))


def _task(row: dict[str, Any], image: Path) -> Task:
    return Task(
        id=str(row["id"]),
        instruction=row["question"],
        ground_truth=row["answer"],
        metadata={"image": str(image)},
    )


def load_tasks(split: str) -> list[Task]:
    if split in HUB_SPLITS:
        return load_hub(split)
    rows = sample_rows(SAMPLE_DIR, split, cookbook="geo3k", other_splits=["hub:train", "hub:test"])
    return [_task(row, SAMPLE_DIR / row["image"]) for row in rows]


def load_hub(split: str, cache_dir: Path | None = None) -> list[Task]:
    """Geometry3K's ``split`` (needs network access and the ``hub`` extra). Its problems refer to
    the diagram as ``<image>``; that marker is dropped since the image travels as its own block."""

    cache = cache_dir or Path(os.environ.get("RLLM_CACHE", Path.home() / ".cache" / "rllm")) / "geo3k"
    (cache / split.replace(":", "_")).mkdir(parents=True, exist_ok=True)
    tasks = []
    for i, row in enumerate(hub_rows(HUB_NAME, split=HUB_SPLITS[split])):
        image = cache / split.replace(":", "_") / f"{i:05d}.png"
        if not image.exists():
            row["images"][0].save(image, format="PNG")
        question = str(row["problem"]).replace("<image>", "").strip()
        tasks.append(_task({"id": f"{split}-{i:05d}", "question": question, "answer": row["answer"]}, image))
    return tasks


if __name__ == "__main__":
    write_sample()
