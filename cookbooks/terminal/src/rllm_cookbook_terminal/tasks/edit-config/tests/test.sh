set -e
printf "[app]\nname=demo\ndebug=true\nport=8080\n" | cmp - settings.ini
