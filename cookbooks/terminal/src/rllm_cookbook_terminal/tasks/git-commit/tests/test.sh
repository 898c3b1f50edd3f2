set -e
test "$(git -C repo log -1 --format=%s)" = "add notes"
git -C repo ls-files --error-unmatch notes.txt >/dev/null
test "$(git -C repo rev-list --count HEAD)" = 2
