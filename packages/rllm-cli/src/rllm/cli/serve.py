"""`rllm serve MODEL_PATH`: a backend's sampler as an OpenAI-compatible server.

Found through the ``rllm.serve`` entry point group (a backend registers a callable
``serve(model_path, host=..., port=..., options=...)`` that blocks until interrupted), so the CLI
never imports a backend package.
"""

from __future__ import annotations

from importlib.metadata import entry_points

import click

from rllm.engine.plugins import PluginNotFoundError

SERVE_GROUP = "rllm.serve"


@click.command("serve")
@click.argument("model_path")
@click.option("--backend", default="tinker", show_default=True, help="whose sampler serves the model")
@click.option("--host", default="127.0.0.1", show_default=True)
@click.option("--port", default=8000, show_default=True, help="port (0: any free port)")
@click.option("--model-name", default=None, help="name clients use in `model` (default: the path's name)")
def serve_command(model_path: str, backend: str, host: str, port: int, model_name: str | None) -> int:
    """Serve MODEL_PATH (a local Hugging Face model directory) at http://HOST:PORT/v1.

    \b
    Example:
      rllm serve runs/say-single/tiny-model --port 8000
      rllm eval say-single --base-url http://127.0.0.1:8000/v1
    """
    found = [ep for ep in entry_points(group=SERVE_GROUP) if ep.name == backend]
    if not found:
        names = ", ".join(sorted(ep.name for ep in entry_points(group=SERVE_GROUP))) or "none"
        raise PluginNotFoundError(f"no backend named {backend!r} can serve models (installed: {names})")
    serve = found[0].load()
    return serve(model_path, host=host, port=port, model_name=model_name) or 0
