xdotool mousemove 240 83 click 1
xdotool mousemove 60 165 click 1
