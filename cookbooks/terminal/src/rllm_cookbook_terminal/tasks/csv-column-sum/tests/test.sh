set -e
test "$(tr -d " \n" < total.txt)" = 172
