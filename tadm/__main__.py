import sys

from tadm.cli import main

sys.exit(main())
