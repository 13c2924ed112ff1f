import sys

from specdemo.cli.commands import main

sys.exit(main())
