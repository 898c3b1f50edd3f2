python3 - <<'EOF'
import json, sys
expect = {'text': 'lumen'}
try:
    state = json.load(open('state.json'))
except (OSError, ValueError):
    sys.exit('the form was never saved')
wrong = {k: state.get(k) for k, v in expect.items() if state.get(k) != v}
sys.exit(f'saved state differs: {wrong}, expected {expect}' if wrong else 0)
EOF
