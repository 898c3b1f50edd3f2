printf '#!/bin/sh\necho hello world\n' > hello.sh && chmod +x hello.sh
