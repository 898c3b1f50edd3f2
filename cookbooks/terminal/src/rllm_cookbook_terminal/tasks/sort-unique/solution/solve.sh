sort -u names.txt > unique.txt
