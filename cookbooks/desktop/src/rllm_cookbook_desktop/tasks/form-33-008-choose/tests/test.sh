exec python3 "$(dirname "$0")/check_form.py" '{"choice": "yellow"}' 2.0
