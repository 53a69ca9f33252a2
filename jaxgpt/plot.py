"""`python -m jaxgpt.plot`, the documented name of jaxgpt/commands/plot.py (read that)."""

from jaxgpt.commands.plot import main

if __name__ == "__main__":
    main()
