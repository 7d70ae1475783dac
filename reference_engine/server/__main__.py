"""`python -m reference_engine.server MODEL_DIR [flags]`: the reference engine's HTTP server
(`inferlab serve` is the same program). Flags: `reference_engine/server/cli.py`."""
import sys

from reference_engine.server.cli import main

sys.exit(main())
