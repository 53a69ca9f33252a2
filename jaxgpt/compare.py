"""`python -m jaxgpt.compare`, the documented name of jaxgpt/commands/compare.py (read that)."""

from jaxgpt.commands.compare import main

if __name__ == "__main__":
    main()
