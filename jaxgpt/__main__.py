"""`python -m jaxgpt COMMAND`: jaxgpt/commands/dispatch.py."""

from jaxgpt.commands.dispatch import main

main()
