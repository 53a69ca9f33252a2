"""`python -m jaxgpt.prepare`, the documented name of jaxgpt/commands/prepare.py (read that)."""

from jaxgpt.commands.prepare import main

if __name__ == "__main__":
    main()
