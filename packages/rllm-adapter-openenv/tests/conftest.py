import sys
from pathlib import Path

# Tests import their loopback players and engine runner from openenv_helpers.py beside them
# (pytest runs with importlib mode, which does not put test directories on sys.path).
sys.path.insert(0, str(Path(__file__).parent))
