import sys

from hlo_passes.cli.main import main

sys.exit(main())
