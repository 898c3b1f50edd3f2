cd repo && git add notes.txt && git commit -q -m 'add notes'
