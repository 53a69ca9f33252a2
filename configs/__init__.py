"""Config files: each defines get_config() -> ml_collections.ConfigDict (see jaxgpt/config/)."""
