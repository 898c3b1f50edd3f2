"""`rllm serve PATH`: a backend's sampler as an OpenAI-compatible server.

PATH is a run folder (its latest checkpoint, or ``--step N``), one checkpoint folder or a model
folder (:mod:`rllm.cli.run_model`); a checkpoint is served as ``RUN-stepN``. A LoRA checkpoint
is first merged into its base model (through ``rllm export``) in a temporary folder, unless the
backend's serve takes checkpoints itself (``checkpoints=True``: the tinker backend serves a run
with several policies so, every adapter under its policy's name).

Found through the ``rllm.serve`` entry point group (a backend registers a callable
``serve(model_path, host=..., port=..., model_name=...)`` that blocks until interrupted), so the
CLI never imports a backend package.
"""

from __future__ import annotations

import inspect
import tempfile
from importlib.metadata import entry_points
from pathlib import Path

import click

from rllm.cli.export_cmd import export_checkpoint
from rllm.cli.run_model import resolve_run_model
from rllm.engine.plugins import PluginNotFoundError

SERVE_GROUP = "rllm.serve"


@click.command("serve")
@click.argument("model_path", type=click.Path(path_type=Path))
@click.option("--backend", default="tinker", show_default=True, help="whose sampler serves the model")
@click.option("--step", type=int, default=None, help="a run folder's checkpoint step (default: the latest)")
@click.option("--host", default="127.0.0.1", show_default=True)
@click.option("--port", default=8000, show_default=True, help="port (0: any free port)")
@click.option(
    "--model-name",
    default=None,
    help="name clients use in `model` (default: RUN-stepN, or the folder's name)",
)
def serve_command(
    model_path: Path, backend: str, step: int | None, host: str, port: int, model_name: str | None
) -> int:
    """Serve MODEL_PATH (a run folder, a checkpoint or a Hugging Face model folder) at http://HOST:PORT/v1.

    \b
    Example:
      rllm serve runs/say --port 8000
      rllm serve runs/say/checkpoints/step_000020
      rllm eval say-single --base-url http://127.0.0.1:8000/v1
    """
    found = [ep for ep in entry_points(group=SERVE_GROUP) if ep.name == backend]
    if not found:
        names = ", ".join(sorted(ep.name for ep in entry_points(group=SERVE_GROUP))) or "none"
        raise PluginNotFoundError(f"no backend named {backend!r} can serve models (installed: {names})")
    model = resolve_run_model(model_path, step)
    serve = found[0].load()
    name = model_name or model.name
    if (model.path / "config.json").is_file():
        return serve(str(model.path), host=host, port=port, model_name=name) or 0
    if "checkpoints" in inspect.signature(serve).parameters:
        served = serve(str(model.path), host=host, port=port, model_name=name, checkpoints=True)
        if served is not None:
            return served
    with tempfile.TemporaryDirectory(prefix="rllm-serve-") as merged:  # a LoRA adapter: merge it first
        export_checkpoint(model.path, Path(merged))
        return serve(merged, host=host, port=port, model_name=name) or 0
