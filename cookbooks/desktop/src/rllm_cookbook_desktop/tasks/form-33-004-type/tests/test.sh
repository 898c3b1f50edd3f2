exec python3 "$(dirname "$0")/check_form.py" '{"text": "lumen"}' 2.0
