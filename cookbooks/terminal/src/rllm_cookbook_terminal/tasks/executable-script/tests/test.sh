set -e
test -x hello.sh
test "$(./hello.sh)" = "hello world"
