"""The subcommands of ``kvbench``; each module registers its own on the parser and stays thin."""
