mkdir files
head -c 100 /dev/zero > files/alpha.bin
head -c 5000 /dev/zero > files/beta.bin
head -c 300 /dev/zero > files/gamma.bin
