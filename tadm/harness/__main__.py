"""``python -m tadm.harness``: lm-evaluation-harness with the tadm model (see tadm.harness)."""

import sys

from tadm.harness import main

sys.exit(main())
