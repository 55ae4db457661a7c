import sys

from salus.device_plugin.plugin import main

sys.exit(main())
