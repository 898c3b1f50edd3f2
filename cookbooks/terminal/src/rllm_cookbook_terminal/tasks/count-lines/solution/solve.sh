wc -l < data.txt > count.txt
