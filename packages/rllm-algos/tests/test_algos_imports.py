import subprocess
import sys


def test_import_rllm_algos_does_not_import_torch() -> None:
    code = (
        "import sys, rllm.algos\n"
        "rllm.algos.AlgorithmConfig().validate()\n"
        "assert 'torch' not in sys.modules, 'rllm.algos imported torch'\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True)
