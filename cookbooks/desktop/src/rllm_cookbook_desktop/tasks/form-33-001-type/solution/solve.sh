xdotool mousemove 195 123 click 1
xdotool type -- kiwi
xdotool mousemove 60 165 click 1
