import sys

from hbfjax.cli import main

sys.exit(main())
