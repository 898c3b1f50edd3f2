"""The tasks' verifier (put into each loaded task's tests as check_form.py by forms.with_app; run
by the sandbox's own python3 from the task's tests/test.sh): exit 0 when the form's saved state
holds every expected value.

Usage: ``python3 check_form.py EXPECTED_JSON SETTLE_S`` in the task's workdir. The app handles
the agent's last click in its own time (the X server has only sent it), so a right state may land
a moment after the episode ends: it gets SETTLE_S seconds to; a wrong one fails after that long,
saying what differs. Standard library only: it runs inside the sandbox.
"""

import json
import sys
import time


def main() -> None:
    expect = json.loads(sys.argv[1])
    deadline = time.monotonic() + float(sys.argv[2])
    while True:
        try:
            with open("state.json") as f:
                state = json.load(f)
        except (OSError, ValueError):
            state = None
        wrong = (
            {k: state.get(k) for k in expect if state.get(k) != expect[k]}
            if isinstance(state, dict)
            else None
        )
        if isinstance(state, dict) and not wrong:
            sys.exit(0)
        if time.monotonic() > deadline:
            break
        time.sleep(0.02)
    sys.exit(
        "the form was never saved" if state is None else f"saved state differs: {wrong}, expected {expect}"
    )


if __name__ == "__main__":
    main()
