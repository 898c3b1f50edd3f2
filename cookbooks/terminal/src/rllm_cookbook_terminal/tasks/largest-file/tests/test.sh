set -e
test "$(tr -d " \n" < largest.txt)" = beta.bin
