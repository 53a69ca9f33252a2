"""`python -m jaxgpt.check`, the documented name of jaxgpt/commands/check.py (read that)."""

from jaxgpt.commands.check import main

if __name__ == "__main__":
    main()
