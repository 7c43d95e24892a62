import sys

from acespec.cli import main

sys.exit(main())
