"""One module per `gptforge` command; each has `main(argv: list[str]) -> int`."""
