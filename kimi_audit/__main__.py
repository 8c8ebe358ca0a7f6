"""`python -m kimi_audit`: the console script's `main()`, with Ctrl-C answered from this module's first line.

The console script calls `main()`, which answers Ctrl-C itself (one line, exit 130); here, the command line's
modules are still to be imported when this module starts, so the same answer covers that import too. Before
this line the interpreter is still starting (site, .pth files): no code of the package runs there.
"""

import os
import sys

try:
    import signal

    signal.signal(signal.SIGINT, lambda signum, frame: (os.write(2, b"interrupted\n"), os._exit(130)))
    from kimi_audit.cli import main

    main()
except KeyboardInterrupt:  # main() answers once it runs; this covers importing it
    print("interrupted", file=sys.stderr, flush=True)
    os._exit(130)
