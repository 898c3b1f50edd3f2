tr a-z A-Z < words.txt > upper.txt
