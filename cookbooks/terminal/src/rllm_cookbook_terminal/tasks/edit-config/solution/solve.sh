sed -i 's/^debug=false$/debug=true/' settings.ini
