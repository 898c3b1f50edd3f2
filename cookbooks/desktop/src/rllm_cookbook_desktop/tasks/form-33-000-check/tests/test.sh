python3 - <<'EOF'
import json, sys, time
expect = {'checked': ['Beta features']}
# The app handles the agent's last click in its own time (the X server has only sent it):
# a right state may land a moment after the episode ends, so it gets 2 s to.
deadline = time.monotonic() + 2.0
while True:
    try:
        state = json.load(open('state.json'))
    except (OSError, ValueError):
        state = None
    wrong = {k: state.get(k) for k, v in expect.items() if state.get(k) != v} if state else None
    if state is not None and not wrong:
        sys.exit(0)
    if time.monotonic() > deadline:
        break
    time.sleep(0.02)
sys.exit('the form was never saved' if state is None else f'saved state differs: {wrong}, expected {expect}')
EOF
