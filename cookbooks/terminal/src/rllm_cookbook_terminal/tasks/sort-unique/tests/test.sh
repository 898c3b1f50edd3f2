set -e
printf "ada\nalan\ngrace\nlinus\n" | cmp - unique.txt
