"""`python -m jaxgpt.hellaswag`, the documented name of jaxgpt/commands/hellaswag.py (read that)."""

from jaxgpt.commands.hellaswag import main

if __name__ == "__main__":
    main()
