"""`python -m steps.record`: steps/record/write.py's command line."""

from steps.record.write import main

main()
