"""`python -m deployments.launch CONFIG`: the launcher (deployments/launch/main.py)."""

import sys

from deployments.launch.main import main

main(sys.argv[1:])
