"""`python -m jaxgpt.evaluate`, the documented name of jaxgpt/commands/evaluate.py (read that)."""

from jaxgpt.commands.evaluate import main

if __name__ == "__main__":
    main()
