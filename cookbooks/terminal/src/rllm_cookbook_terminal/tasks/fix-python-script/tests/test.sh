set -e
test "$(python3 sum_to_ten.py)" = 55
grep -q "range" sum_to_ten.py
