exec python3 "$(dirname "$0")/check_form.py" '{"choice": "purple"}' 2.0
