set -e
test "$(tr -d " \n" < count.txt)" = 7
