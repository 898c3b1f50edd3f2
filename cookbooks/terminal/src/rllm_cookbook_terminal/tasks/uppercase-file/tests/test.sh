set -e
printf "ALPHA BETA\nGAMMA\nDELTA EPSILON\n" | cmp - upper.txt
