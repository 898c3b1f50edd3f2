exec python3 "$(dirname "$0")/check_form.py" '{"checked": ["Auto save"]}' 2.0
