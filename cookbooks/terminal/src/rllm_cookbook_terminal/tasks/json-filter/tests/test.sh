set -e
printf "bob\ndora\n" | cmp - names.txt
