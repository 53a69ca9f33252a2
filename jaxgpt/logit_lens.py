"""`python -m jaxgpt.logit_lens`, the documented name of jaxgpt/commands/logit_lens.py (read that)."""

from jaxgpt.commands.logit_lens import main

if __name__ == "__main__":
    main()
