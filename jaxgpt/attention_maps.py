"""`python -m jaxgpt.attention_maps`, the documented name of jaxgpt/commands/attention_maps.py (read that)."""

from jaxgpt.commands.attention_maps import main

if __name__ == "__main__":
    main()
