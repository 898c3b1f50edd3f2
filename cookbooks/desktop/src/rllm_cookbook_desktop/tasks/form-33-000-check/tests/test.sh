exec python3 "$(dirname "$0")/check_form.py" '{"checked": ["Beta features"]}' 2.0
