total = sum(range(1, 10))
print(total)
