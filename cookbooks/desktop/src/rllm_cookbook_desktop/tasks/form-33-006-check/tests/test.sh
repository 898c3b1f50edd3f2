exec python3 "$(dirname "$0")/check_form.py" '{"checked": ["Subscribe"]}' 2.0
