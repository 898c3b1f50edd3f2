sed -i 's/range(1, 10)/range(1, 11)/' sum_to_ten.py
