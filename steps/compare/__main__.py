"""`python -m steps.compare`: see steps/compare/__init__.py."""

from steps.compare import main

main()
