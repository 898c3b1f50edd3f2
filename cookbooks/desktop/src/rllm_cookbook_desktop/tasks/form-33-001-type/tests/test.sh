exec python3 "$(dirname "$0")/check_form.py" '{"text": "kiwi"}' 2.0
