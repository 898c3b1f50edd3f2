exec python3 "$(dirname "$0")/check_form.py" '{"checked": ["Notifications"]}' 2.0
