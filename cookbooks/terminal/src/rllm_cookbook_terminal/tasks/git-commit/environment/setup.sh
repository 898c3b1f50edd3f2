set -e
git init -q repo
cd repo
git config user.email agent@example.com
git config user.name agent
echo 'first' > readme.txt
git add readme.txt
git commit -q -m 'initial'
echo 'remember the milk' > notes.txt
